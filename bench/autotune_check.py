"""GPU check of the auto-tuner: predicted vs measured step time and peak memory of the plans it ranks, on 1 or
2 GPUs, for Llama-3-8B, Qwen2-VL-7B and Wan2.1-1.3B (81x480x832) shapes with reduced layer counts.

The models and why their layers are reduced: ``bench/_autotune_models.py``. The plans: ``search_plans`` (what
``lf plan`` prints) on the detected cluster; by default its ``--top`` first measurable plans, with
``--exhaustive`` every valid plan of the sweep space ``--sweep`` (``bench/_autotune_sweep.py``: ZeRO stages,
recompute modes, micro-batches; tp / cp / dp as the search gives them on ``--gpus``), with the chosen plan's
throughput as a fraction of the sweep's best. Each plan: the model built on meta, materialized (seed 0),
recomputed per its mode, parallelized by lf-parallel (``parallelize``: tp + sp, ring / Ulysses cp, DDP / FSDP2
ZeRO), fused AdamW, bf16 autocast over float32 master weights; ``--warmup`` (2) steps, then the median of
``--steps`` (3) timed steps, each the slowest rank's; peak memory ``max_memory_allocated`` over the timed steps
(largest rank). Predictions with the BENCH.md default rates and with ``calibrate()``'s measured ones; on 2
GPUs the measured ones also hold the intra-node collectives (``measure_collectives``: alpha and bus bandwidth
of all-gather, reduce-scatter and all-reduce, JSON ``comm_calibration``, or its ``error`` when the timings
allow no fit; with ``--dry`` timed on gloo and recorded only). The loss must be finite. JSON (``--out``)
rewritten after every plan, so a job cut short keeps what it measured.

Run on the GPU machine (prints the estimated GPU time first; ``--max-plans`` caps the sweep)::

    python bench/autotune_check.py --out bench/results/autotune_check.json                      # 1 GPU, llama3
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 torchrun --nproc-per-node 2 bench/autotune_check.py \\
        --gpus 2 --model wan_dit --exhaustive --sweep small --out bench/results/autotune_wan_h200x2.json
    python bench/autotune_check.py --gpus 2 --model qwen2_vl --exhaustive --estimate   # plans + GPU time only

``--dry``: the recipes' tiny sizes on the CPU (``--gpus 2``: two spawned gloo processes), predictions for
H200s; ``--estimate``: list the plans and the estimated GPU time, measure nothing.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist

from lf_ir import materialize
from lf_memory import apply_recompute
from lf_parallel import (
    build_mesh,
    build_optimizer,
    calibrate,
    context_parallel_of,
    default_calibration,
    detect_cluster,
    make_cluster,
    measure_collectives,
    parallelize,
    search_plans,
    step_cost,
)

GIB = 1024 ** 3
HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


MODELS, SWEEP = _load("_autotune_models"), _load("_autotune_sweep")


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/results/autotune_check.json"))
    p.add_argument("--model", choices=sorted(MODELS.WORKLOADS), default="llama3")
    p.add_argument("--gpus", type=int, choices=(1, 2), default=1)
    p.add_argument("--dry", action="store_true", help="tiny models on the CPU, gloo; predictions for H200s")
    p.add_argument("--estimate", action="store_true", help="list the plans and the estimated GPU time only")
    p.add_argument("--exhaustive", action="store_true", help="measure every valid plan of --sweep")
    p.add_argument("--sweep", choices=sorted(SWEEP.SWEEPS), default="small")
    p.add_argument("--max-plans", type=int, default=0, help="measure at most this many (0: no cap)")
    p.add_argument("--top", type=int, default=5, help="without --exhaustive: plans measured")
    p.add_argument("--layers", type=int, default=None, help="decoder layers / DiT blocks (see _autotune_models)")
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--global-batch", type=int, default=None, help="default: 4 (wan_dit: 2) per step")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    return p.parse_args(argv)


def _plans(args, work, cluster):
    batch = args.global_batch or (2 if args.model == "wan_dit" else 4)
    result = search_plans(work.graph, cluster, global_batch=batch, seq=work.seq, top=1 << 30,
                          min_cp_tokens=min(2048, work.seq // 4) if args.dry else 2048)
    space = args.sweep if args.exhaustive else "any"
    cands, skipped = SWEEP.select(result.ranked, space, args.gpus, work.cp_loss is not None)
    cands = cands if args.exhaustive else cands[:args.top]
    if args.max_plans:
        cands = cands[:args.max_plans]
    return batch, cands, skipped, result


def _measure(args, work, cand, device: torch.device) -> dict:
    plan = msgspec.structs.replace(cand.plan, precision="fp32")  # autocast sets the compute dtype
    world = plan.world_size
    with torch.device("meta"):
        model = work.build()
    model = materialize(model, device, seed=0)

    def recompute(m):
        apply_recompute(torch.nn.ModuleList(m.blocks), cand.recompute)

    mesh, loss_fn, dp_rank = None, work.loss, 0
    if world > 1:
        mesh = build_mesh(plan, device.type)
        model = parallelize(model, mesh, plan, loss_parallel=False, recompute=recompute)
        coord = mesh.get_coordinate()
        dp_rank = coord[1] * mesh["dp_shard"].size() + coord[2]
        if plan.cp > 1:
            cp = context_parallel_of(mesh, plan)
            loss_fn = lambda m, b: work.cp_loss(m, b, cp)  # noqa: E731
        opt = build_optimizer(model, mesh, plan, lr=1e-4, **({"fused": True} if device.type == "cuda" else {}))
    else:
        recompute(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    batches = [work.batch(plan.micro_batch, 1000 * dp_rank + i, device.type) for i in range(plan.grad_accum)]
    cuda = device.type == "cuda"
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        if step == args.warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        total = torch.zeros((), device=device)
        for b in batches:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = loss_fn(model, b) / plan.grad_accum
            loss.backward()
            total += loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        stats = torch.tensor([time.perf_counter() - start, float(total)], device=device)
        if world > 1:
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # slowest rank (loss: largest rank's, finite check)
        times.append(float(stats[0]))
        losses.append(float(stats[1]))
    peak = torch.tensor(float(torch.cuda.max_memory_allocated()) if cuda else 0.0, device=device)
    if world > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    del model, opt, batches
    gc.collect()  # the recompute wrappers and hooks form reference cycles: without this the model lingers on the
    if cuda:      # GPU into the next plan and inflates its peak (seen: 76.4 GiB in a sweep vs 56.9 GiB alone)
        torch.cuda.empty_cache()
    finite = all(v == v and abs(v) != float("inf") for v in losses)
    return {"step_s": statistics.median(times[args.warmup:]), "step_s_timed": times[args.warmup:],
            "peak_gib": float(peak) / GIB, "losses": losses, "loss_finite": finite}


def _row(cand, work, cluster, cal_measured) -> dict:
    row = {"plan": cand.plan.describe(), "recompute": cand.recompute,
           "predicted_default": {"step_s": cand.cost.step_s, "peak_gib": cand.cost.memory.total / GIB,
                                 "tokens_per_s_per_gpu": cand.cost.tokens_per_s_per_gpu}}
    if cal_measured is not None:
        cost = step_cost(work.graph, cand.plan, cluster, recompute=cand.recompute, seq=work.seq,
                         calibration=cal_measured)
        row["predicted_calibrated"] = {"step_s": cost.step_s}
    return row


def run(args) -> None:
    from lf_parallel import init_distributed

    ctx = init_distributed("cpu" if args.dry or args.estimate else "cuda")
    work = MODELS.WORKLOADS[args.model](args.layers, args.seq, args.dry)
    if args.dry or not torch.cuda.is_available():
        cluster = make_cluster(gpus=args.gpus, gpu="h200")
    else:
        cluster = detect_cluster({"LOCAL_WORLD_SIZE": str(args.gpus), "WORLD_SIZE": str(args.gpus)})
    batch, cands, skipped, result = _plans(args, work, cluster)
    main = ctx.rank == 0
    if main:
        est = SWEEP.estimate_s(cands, args.model, args.warmup, args.steps)
        print(f"{work.name} on {cluster.describe()}, global batch {batch}: {len(cands)} plans to measure "
              f"({result.considered} considered, {len(skipped)} skipped); estimated GPU time {est:.0f} s", flush=True)
        for c in cands:
            print(f"  {c.plan.describe()} recompute={c.recompute} predicted {c.cost.step_s:.3f} s", flush=True)
    if args.estimate:
        return
    cal_default = default_calibration(cluster.gpu)
    cal_measured = None if args.dry or not main else calibrate(save=False)  # calibrate() runs on cuda:0
    if ctx.distributed:
        dist.barrier()
    comm = None
    if ctx.world_size > 1:  # every rank times the collectives; on the GPU they join the measured calibration
        try:
            comm = measure_collectives(gpus_per_node=cluster.gpus_per_node)
        except ValueError as err:  # timings no fit can use (every rank sees the same ones): record why, go on
            comm = {"error": str(err)}
        if main:
            print(f"collectives: {comm['error']}" if isinstance(comm, dict) else f"collectives ({comm.source}): "
                  + ", ".join(f"{k} alpha {comm.alpha_us[k]:.1f} us busbw {comm.busbw_gbps[k]:.1f} GB/s"
                              for k in comm.alpha_us), flush=True)
        if cal_measured is not None and not isinstance(comm, dict):
            cal_measured = msgspec.structs.replace(cal_measured, comm=comm)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    if subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=HERE).returncode:
        commit += " + uncommitted changes"
    report = {"model": work.name, "seq": work.seq, "global_batch": batch, "gpus": args.gpus,
              "cluster": cluster.describe(), "mode": f"exhaustive, sweep {args.sweep}" if args.exhaustive
              else f"top {args.top}", "warmup": args.warmup, "steps": args.steps, "torch": torch.__version__,
              "device": "cpu (dry)" if args.dry else torch.cuda.get_device_name(0), "commit": commit,
              "calibration_default": msgspec.to_builtins(cal_default),
              "calibration_measured": None if cal_measured is None else msgspec.to_builtins(cal_measured),
              "comm_calibration": None if comm is None else msgspec.to_builtins(comm),
              "skipped": skipped, "plans": []}
    for cand in cands:
        row = _row(cand, work, cluster, cal_measured)
        try:
            row["measured"] = m = _measure(args, work, cand, ctx.device)
            row["error"] = {"step_default": cand.cost.step_s / m["step_s"] - 1}
            if "predicted_calibrated" in row:
                row["error"]["step_calibrated"] = row["predicted_calibrated"]["step_s"] / m["step_s"] - 1
            if m["peak_gib"]:
                row["error"]["peak_memory"] = cand.cost.memory.total / GIB / m["peak_gib"] - 1
        except torch.OutOfMemoryError as err:  # one rank's OOM: the others fail in their next collective
            row["measured"] = {"oom": str(err)[:300]}
            torch.cuda.empty_cache()
        report["plans"].append(row)
        report["summary"] = SWEEP.summary(report["plans"])
        if main:
            print(json.dumps(row)[:500], flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1))
    if main:
        print(json.dumps(report.get("summary", {})), flush=True)
        print(f"wrote {args.out}", flush=True)


def main(argv=None) -> None:
    args = _args(argv)
    if args.gpus == 1 or args.estimate and not args.dry:
        run(args)
        return
    sys.path.insert(0, str(HERE))
    from _launch import launch

    launch(run, args, dry_world=args.gpus)


if __name__ == "__main__":
    main()
