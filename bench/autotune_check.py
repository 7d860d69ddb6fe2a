"""GPU check of the auto-tuner: predicted vs measured step time and peak memory of its top plans on 1 GPU.

Llama-3-8B shapes (layers reduced with ``--layers`` so variants without recomputation fit one GPU),
S = ``--seq``, bf16 autocast over float32 master weights (lf-memory's ``PrecisionPolicy``), fused AdamW,
micro-batch and recompute variants the tuner ranks for one GPU (ZeRO-0: no wrapper). Each plan: 2
warm-up steps, then the median of ``--steps`` timed steps; peak memory is
``torch.cuda.max_memory_allocated`` over the timed steps. Predictions are made twice: with the
BENCH.md default rates and with ``calibrate()``'s measured rates (cached JSON). The loss must be finite
and fall. Writes JSON (``--out``) with every figure and the relative errors.

Run on the GPU machine (one command)::

    NCCL_NVLS_ENABLE=0 python bench/autotune_check.py --out bench/results/autotune_check.json

``--dry`` predicts only (works on a CPU machine, for the H200 catalogue entry).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import msgspec
import torch

from lf_ir import Llama3Model, llama3_config, materialize
from lf_ir.recipes import llama3
from lf_ir.recipes.llama3 import next_token_loss
from lf_memory import apply_recompute
from lf_parallel._calibrate import calibrate, default_calibration
from lf_parallel._cluster import detect_cluster, make_cluster
from lf_parallel._cost_model import step_cost
from lf_parallel._search import search_plans

GIB = 1024 ** 3


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/results/autotune_check.json"))
    p.add_argument("--dry", action="store_true", help="predict only, no GPU work")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    return p.parse_args()


def _measure(cfg, graph, cand, global_batch: int, seq: int, steps: int) -> dict:
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Llama3Model(cfg, graph)
    model = materialize(model, "cuda", seed=0)
    apply_recompute(model.blocks, cand.recompute)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    mb, accum = cand.plan.micro_batch, cand.plan.grad_accum
    data = torch.randint(0, cfg.vocab_size, (global_batch, seq), device="cuda")
    times, losses = [], []
    for step in range(2 + steps):
        if step == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        start = time.perf_counter()
        total = 0.0
        for i in range(accum):
            ids = data[i * mb:(i + 1) * mb]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = next_token_loss(model(ids), ids) / accum
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(total)
    peak = torch.cuda.max_memory_allocated()
    del model, opt
    torch.cuda.empty_cache()
    finite = all(map(lambda v: v == v and abs(v) != float("inf"), losses))
    return {"step_s": statistics.median(times[2:]), "peak_gib": peak / GIB, "losses": losses,
            "loss_ok": finite and losses[-1] < losses[0]}


def main() -> None:
    args = _args()
    cfg = llama3_config("8B", layers=args.layers)
    graph = llama3.build_graph(cfg, args.seq)
    cluster = make_cluster(gpus=1, gpu="h200") if args.dry else detect_cluster({"LOCAL_WORLD_SIZE": "1"})
    cal_default = default_calibration(cluster.gpu)
    cal_measured = None if args.dry else calibrate()
    result = search_plans(graph, cluster, global_batch=args.global_batch, seq=args.seq, top=200)
    cands = [c for c in result.ranked if c.plan.zero_stage == 0][: args.top]
    rows = []
    for cand in cands:
        row = {"plan": cand.plan.describe(), "recompute": cand.recompute,
               "predicted_default": {"step_s": cand.cost.step_s, "peak_gib": cand.cost.memory.total / GIB,
                                     "memory_gib": {k: v / GIB for k, v in cand.cost.memory.breakdown().items()}}}
        if cal_measured is not None:
            cost = step_cost(graph, cand.plan, cluster, recompute=cand.recompute, seq=args.seq,
                             calibration=cal_measured)
            row["predicted_calibrated"] = {"step_s": cost.step_s}
            try:
                row["measured"] = _measure(cfg, graph, cand, args.global_batch, args.seq, args.steps)
            except torch.OutOfMemoryError as err:
                row["measured"] = {"oom": str(err)[:300]}
                torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row)[:400], flush=True)
                continue
            m = row["measured"]
            row["error"] = {"step_default": cand.cost.step_s / m["step_s"] - 1,
                            "step_calibrated": cost.step_s / m["step_s"] - 1,
                            "peak_memory": cand.cost.memory.total / GIB / m["peak_gib"] - 1}
        rows.append(row)
        print(json.dumps(row)[:400], flush=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    report = {"model": f"llama3-8B shapes, {args.layers} layers", "seq": args.seq,
              "global_batch": args.global_batch, "cluster": cluster.describe(), "torch": torch.__version__,
              "device": None if args.dry else torch.cuda.get_device_name(0), "commit": commit,
              "calibration_default": msgspec.to_builtins(cal_default),
              "calibration_measured": None if cal_measured is None else msgspec.to_builtins(cal_measured),
              "plans": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
