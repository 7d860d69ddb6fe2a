"""``bench/vla_peer.py --dry``: the 2-GPU ~3B VLA benchmark's code paths on 2 gloo CPU processes, tiny models.

One run (both variants, lf and the transformers peer, full recompute, 2 steps each) writes the JSON the tests
read. Oracles: the single-process run of lf's tiny models (same ``materialize`` seed, the script's per-rank
batches) for lf's first losses; the meta-device parameter counts of lf and the peer at the 3B sizes (within
0.5%); the written file for the rest.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "vla_peer.py"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "vla_peer_dry.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--recompute", "full", "--out", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_run_and_its_rates(result):
    """Oracle: the written file. Both variants, both implementations: 2 steps, finite falling loss, rates that
    follow from the median step time, and the lf / peer ratio."""
    assert set(result["variants"]) == {"tokens", "flow"} and result["recompute"] == "full"
    for variant, v in result["variants"].items():
        assert set(v["runs"]) == {"lf", "transformers"}
        for name, r in v["runs"].items():
            assert "error" not in r, (variant, name, r.get("error"))
            assert len(r["losses"]) == 2 and r["loss_finite"] and r["loss_falling"], (variant, name)
            per_s = result["batch_per_gpu"] / r["step_s_median"]
            assert r["samples_per_s_per_gpu"] == pytest.approx(per_s)
            assert r["tokens_per_s_per_gpu"] == pytest.approx(per_s * v["tokens_per_sample"])
            assert r["mfu"] == pytest.approx(per_s * v["flops_per_sample"] / 989.4e12)
        assert v["speedup_lf_over_peer"] == pytest.approx(
            v["runs"]["transformers"]["step_s_median"] / v["runs"]["lf"]["step_s_median"])
        assert v["runs"]["lf"]["parallel"].startswith("dp=2")
        assert abs(v["params_peer"] / v["params_lf"] - 1) < 0.05  # tiny: positions / norm biases weigh more


def test_3b_peers_have_lf_parameter_count(result):
    """Oracle: meta-device counts of lf's recipe and the transformers peer at the 3B sizes, within 0.5%."""
    counts = result["params_3b"]
    assert counts["tokens"]["lf"] == 3_433_970_928 and counts["flow"]["lf"] == 3_129_531_636
    for c in counts.values():
        assert abs(c["peer"] / c["lf"] - 1) <= 0.005 and abs(c["relative_difference"]) <= 0.005


def test_lf_first_losses_equal_single_process(result):
    """Oracle: one process, the tiny models (seed 0), the mean of the two ranks' batch losses under the same
    bf16 autocast. DDP's ranks start from the same weights, so each rank's first loss is this model's on its
    batch: observed equal to float rounding, checked at 1e-2 (bf16)."""
    from lf_ir import materialize
    from lf_memory import resolve_precision

    bench = _module(SCRIPT, "vla_peer_bench")
    for variant in ("tokens", "flow"):
        cfg = bench.model_config(variant, dry=True)
        with torch.device("meta"):
            model = bench._models(variant)[0](cfg)
        model = materialize(model, "cpu", seed=0)
        losses = []
        for rank in range(2):
            batch = bench.make_batch(variant, cfg, result["batch_per_gpu"], rank, "cpu")
            with torch.no_grad(), resolve_precision("bf16", "cpu").autocast("cpu"):
                losses.append(float(bench._Loss(model, lf=True)(batch)))
        got = result["variants"][variant]["runs"]["lf"]["first_loss"]
        assert math.isclose(got, sum(losses) / 2, rel_tol=1e-2), (variant, got, losses)


def test_report_renders_the_result(result):
    """Oracle: the file. BENCHMARKS.md's renderer gives one row per run with lf's ratio."""
    lines = _module(REPO / "bench" / "report.py", "bench_report")._vla_peer(result)
    rows = [line for line in lines if line.startswith("| vla")]
    assert len(rows) == 4 and sum("x |" in r for r in rows) == 2
