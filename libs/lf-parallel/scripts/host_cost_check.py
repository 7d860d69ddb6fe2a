"""Re-predict the committed 1-GPU measurements with the current cost model (host-launch term included).

Rows: every plan of ``bench/results/autotune_{llama3,qwen2_vl,wan_dit}_h200.json`` (measured step, the
prediction recorded then with the default rates) and the fused-ops-off rows of
``bench/results/step_anatomy_h200.json`` / ``step_anatomy_qwen_h200.json`` (the Qwen2-VL rows of the former
predate the host-side image grids, so only the latter's are used). Predictions use the default calibration
on ``make_cluster(gpus=1, gpu="h200")``, as the sweeps did. No GPU needed.

    python libs/lf-parallel/scripts/host_cost_check.py            # prints the table
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "bench" / "results"
_MODEL = {"llama3": "llama3", "qwen2_vl": "qwen2_vl", "wan_dit": "wan_dit"}


@cache
def _workload(model: str):
    spec = importlib.util.spec_from_file_location("_autotune_models", ROOT / "bench" / "_autotune_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_autotune_models", module)
    spec.loader.exec_module(module)
    return module.WORKLOADS[model](None, None, False)


def rows() -> list[dict]:
    """``{source, model, micro_batch, grad_accum, recompute, measured_s, old_s}`` of every committed row."""
    out = []
    for model in _MODEL:
        data = json.loads((RESULTS / f"autotune_{model}_h200.json").read_text())
        for p in data["plans"]:
            mb, ga = (int(re.search(rf"{k}=(\d+)", p["plan"]).group(1)) for k in ("micro_batch", "grad_accum"))
            out.append({"source": "sweep", "model": model, "micro_batch": mb, "grad_accum": ga,
                        "recompute": p["recompute"], "measured_s": p["measured"]["step_s"],
                        "old_s": p["predicted_default"]["step_s"]})
    for name in ("step_anatomy_h200", "step_anatomy_qwen_h200"):
        for r in json.loads((RESULTS / f"{name}.json").read_text())["rows"]:
            model = r["model"].split("-")[0]
            if r["fused_ops"] or (model == "qwen2_vl") != ("qwen" in name):
                continue
            out.append({"source": "anatomy", "model": model, "micro_batch": r["micro_batch"],
                        "grad_accum": r["grad_accum"], "recompute": r["recompute"], "measured_s": r["step_s"],
                        "old_s": None, "launches": r["kernel_launches"]})
    return out


def predict(row: dict, calibration=None):
    """The cost model's :class:`~lf_parallel._cost_model.StepCost` for ``row``'s model and plan."""
    from lf_parallel import Plan
    from lf_parallel._cluster import make_cluster
    from lf_parallel._cost_model import step_cost

    work = _workload(row["model"])
    plan = Plan(dp=1, micro_batch=row["micro_batch"], grad_accum=row["grad_accum"])
    return step_cost(work.graph, plan, make_cluster(gpus=1, gpu="h200"), recompute=row["recompute"],
                     seq=work.seq, calibration=calibration)


def table(calibration=None) -> list[dict]:
    """Every row with ``new_s`` (predicted step), ``error`` (new / measured - 1) and ``launches_pred``."""
    result = []
    for row in rows():
        cost = predict(row, calibration)
        result.append({**row, "new_s": cost.step_s, "error": cost.step_s / row["measured_s"] - 1,
                       "launches_pred": cost.launches, "launch_host_s": cost.launch_host_s})
    return result


def main() -> None:
    print(f"{'source':8} {'model':9} {'mb x ga':7} {'recompute':9} {'measured':>8} {'old':>12} {'new':>14} "
          f"{'launches meas/pred':>19}")
    for r in table():
        old = f"{r['old_s']:.3f} {r['old_s'] / r['measured_s'] - 1:+.0%}" if r["old_s"] else "-"
        launches = f"{r['launches']:.0f}/{r['launches_pred']:.0f}" if "launches" in r else "-"
        print(f"{r['source']:8} {r['model']:9} {r['micro_batch']} x {r['grad_accum']:<3} {r['recompute']:9} "
              f"{r['measured_s']:8.3f} {old:>12} {r['new_s']:8.3f} {r['error']:+5.1%} {launches:>19}")


if __name__ == "__main__":
    main()
