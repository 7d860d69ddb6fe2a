"""Peak memory and step time on one H200 against lf-memory's and lf-parallel's predictions, three model families.

For each workload (Llama-3-8B at S = 8192 with ``--llama-layers`` of its 32 blocks so fp32 AdamW fits one GPU;
Qwen2-VL-7B with ``--qwen-layers`` of its 28 decoder blocks on one 448x448 image (1,024 patches, 256 merged
tokens) plus 1,024 text tokens in one 1,280-token sample; Wan2.1-1.3B on 81 frames at 480x832, 21x60x104
latents = 32,760 tokens, 512 text tokens, flow-matching loss) and each recompute plan (``none``, ``full``,
``selective``, ``auto``), the model is built the trainer's way on one GPU (dp = 1, so no ``parallelize``
wrapper: lf-ir recipe on the meta device -> ``materialize`` (float32 master weights) ->
``lf_memory.apply_recompute`` -> bf16 autocast (``PrecisionPolicy(float32, bfloat16)``) -> fused AdamW) and
runs ``--warmup`` (3) + ``--steps`` (5) optimizer steps on one fixed batch (the loss must fall). Recorded per plan:

- memory: ``torch.cuda.max_memory_allocated`` over the timed steps against ``estimate_memory`` (kernels
  ``"cuda"``) and the relative error. For ``auto`` the prediction is the ``none`` estimate with its activations
  replaced by the plan's bytes (``plan_recompute``, lf-ir's CPU byte rules) plus ``full``'s recompute
  temporaries;
- time: the median step (synchronized wall clock) against ``step_cost`` on ``make_cluster(gpus=1, gpu="h200")``
  for the dp = 1 plan, relative error. For ``auto``: ``none``'s prediction plus the share of ``full``'s extra
  time given by the plan's recomputed FLOPs over full recompute's;
- auto: the activation budget is half-way between all-``full`` and all-``selective`` bytes, so among uniform
  modes only ``full`` fits it; the plan's bytes, that it fits, its recomputed FLOPs and full recompute's, and
  whether the measured peaks order as full <= auto <= selective.

A plan whose ``estimate_memory`` exceeds the GPU is not run (recorded as ``skipped``); an out-of-memory error is
recorded and the next plan runs. Workloads free their model and optimizer before the next. The JSON is
rewritten after every plan. About 4 minutes on one H200.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python bench/memory_check.py --out bench/results/memory_check_h200.json
    python bench/memory_check.py --dry --out /tmp/memory_check_dry.json   # CPU: tiny sizes, 2 steps
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import subprocess
import time
import traceback
from pathlib import Path

import msgspec
import torch

from lf_ir import Llama3Model, llama3_config, materialize, next_token_loss
from lf_ir.recipes import llama3, qwen2_vl, wan_dit
from lf_memory import PrecisionPolicy, apply_recompute, estimate_memory, plan_recompute
from lf_parallel import check_plan, make_cluster, parse_plan, step_cost

GIB = 2 ** 30
PLANS = ("none", "selective", "full", "auto")


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--dry", action="store_true", help="CPU smoke run: tiny models, 2 steps, no warm-up")
    p.add_argument("--workload", action="append", choices=("llama3", "qwen2_vl", "wan_dit"),
                   help="workload to run (repeatable); default all three")
    p.add_argument("--llama-layers", type=int, default=16, help="Llama-3-8B blocks kept (of 32)")
    p.add_argument("--qwen-layers", type=int, default=14, help="Qwen2-VL-7B decoder blocks kept (of 28)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-4)
    args = p.parse_args(argv)
    args.workloads = args.workload or ["llama3", "qwen2_vl", "wan_dit"]
    if args.dry:
        args.warmup, args.steps = 0, 2
    return args


def _llama(args, device):
    """(description, model built on meta, batch function, loss function)."""
    seq = 32 if args.dry else 8192
    cfg = llama3_config("tiny", layers=4) if args.dry else llama3_config("8B", layers=args.llama_layers)
    graph = llama3.build_graph(cfg, seq_len=seq)
    with torch.device("meta"):
        model = Llama3Model(cfg, graph)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0)).to(device)
    desc = {"model": f"Llama-3-8B, {cfg.layers} of 32 blocks" if not args.dry else "llama3 tiny, 4 blocks",
            "shape": f"1 x {seq} tokens"}
    return desc, model, lambda m: next_token_loss(m(ids), ids)


def _qwen(args, device):
    if args.dry:
        cfg, side, text = qwen2_vl.qwen2_vl_config("tiny"), 4, 8
    else:
        cfg, side, text = qwen2_vl.qwen2_vl_config("7B", layers=args.qwen_layers), 32, 1024  # 448 px / 14
    patches, merged = side * side, side * side // cfg.spatial_merge_size ** 2
    seq = merged + text
    graph = qwen2_vl.build_graph(cfg, seq_len=seq, image_patches=patches)
    with torch.device("meta"):
        model = qwen2_vl.Qwen2VLModel(cfg, graph)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(cfg.image_token_id, 150_000), (1, seq), generator=gen)
    ids[0, 1], ids[0, 2:2 + merged], ids[0, 2 + merged] = (cfg.vision_start_token_id, cfg.image_token_id,
                                                           cfg.vision_end_token_id)
    pixels = torch.randn(patches, 3 * cfg.temporal_patch_size * cfg.patch_size ** 2, generator=gen)
    ids, pixels, grid = ids.to(device), pixels.to(device), torch.tensor([[1, side, side]], device=device)
    desc = {"model": "qwen2_vl tiny" if args.dry else f"Qwen2-VL-7B, {cfg.layers} of 28 decoder blocks, ViT 32",
            "shape": f"1 image {side * 14}x{side * 14} ({patches} patches, {merged} tokens) + {text} text tokens"}
    return desc, model, lambda m: next_token_loss(m(ids, pixels, grid), ids)


def _wan(args, device):
    cfg = wan_dit.wan_dit_config("tiny", layers=4) if args.dry else wan_dit.wan_dit_config("1.3B")
    grid = (3, 6, 10) if args.dry else (21, 60, 104)  # latents: 81 frames at 480x832 (VAE 4x8x8)
    seq = math.prod(g // p for g, p in zip(grid, cfg.patch, strict=True))
    graph = wan_dit.build_graph(cfg, seq_len=seq)
    with torch.device("meta"):
        model = wan_dit.WanDiTModel(cfg, graph)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, cfg.in_channels, *grid, generator=gen).to(device)
    text = torch.randn(1, cfg.text_len, cfg.text_dim, generator=gen).to(device)
    noise, sigma = torch.randn(x0.shape, generator=gen).to(device), torch.tensor([0.6], device=device)
    desc = {"model": "wan_dit tiny, 4 blocks" if args.dry else "Wan2.1-T2V-1.3B",
            "shape": f"latents {grid} = {seq} tokens, {cfg.text_len} text tokens"}
    return desc, model, lambda m: m.flow_loss(x0, text, noise, sigma)


WORKLOADS = {"llama3": _llama, "qwen2_vl": _qwen, "wan_dit": _wan}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _predictions(graph, cluster) -> dict:
    """Per plan: estimate_memory's peak, step_cost's time; the auto plan and its budget."""
    plan = check_plan(parse_plan("dp=1", precision="bf16", micro_batch=1), world_size=1, global_batch=1, graph=graph)
    est = {m: estimate_memory(graph, None, batch=1, precision="bf16", recompute=m, kernels="cuda")
           for m in ("none", "selective", "full")}
    cost = {m: step_cost(graph, plan, cluster, recompute=m, precision="bf16").step_s
            for m in ("none", "selective", "full")}
    big = 2 ** 60
    full = plan_recompute(graph, big, 1, None, 2, options=("full",))
    selective = plan_recompute(graph, big, 1, None, 2, options=("selective", "full"))
    budget = (full.saved_bytes + selective.saved_bytes) // 2
    auto = plan_recompute(graph, budget, 1, None, 2)
    share = auto.recompute_flops / full.recompute_flops if full.recompute_flops else 0.0
    n = est["none"]
    auto_peak = msgspec.structs.replace(n, activations=auto.saved_bytes, temporaries=est["full"].temporaries).total
    return {
        "memory_gib": {**{m: e.total / GIB for m, e in est.items()}, "auto": auto_peak / GIB},
        "memory_breakdown_gib": {m: {k: v / GIB for k, v in e.breakdown().items()} for m, e in est.items()},
        "step_s": {**cost, "auto": cost["none"] + share * (cost["full"] - cost["none"])},
        "auto": {"budget_activation_gib": budget / GIB, "plan_activation_gib": auto.saved_bytes / GIB,
                 "fits": auto.fits and auto.saved_bytes <= budget, "counts": auto.counts(),
                 "selective_everywhere_gib": selective.saved_bytes / GIB, "full_everywhere_gib": full.saved_bytes / GIB,
                 "uniform_selective_fits": selective.saved_bytes <= budget,
                 "recompute_tflop": auto.recompute_flops / 1e12, "full_recompute_tflop": full.recompute_flops / 1e12,
                 "fewer_flops_than_full": auto.recompute_flops < full.recompute_flops},
        "_plan": auto,
    }


def _run_plan(name: str, build, pred: dict, args, device) -> dict:
    """Build the model for one recompute plan, run the steps, return the measurements."""
    desc, model, loss_fn = build(args, device)
    model = materialize(model, device, seed=0)
    if name == "auto":
        apply_recompute(model.blocks, "auto", plan=pred["_plan"])
    else:
        apply_recompute(model.blocks, name)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    policy = PrecisionPolicy(torch.float32, torch.bfloat16)
    times, losses = [], []
    try:
        for i in range(args.warmup + args.steps):
            if i == args.warmup and device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            t0 = time.perf_counter()
            with policy.autocast(device):
                loss = loss_fn(model)
            loss.float().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(device)
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach().float()))
        peak = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None
    finally:
        del model, opt
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    step = statistics.median(times[args.warmup:])
    out = {"step_s_median": step, "step_s_timed": times[args.warmup:], "losses": losses,
           "loss_finite": all(math.isfinite(x) for x in losses), "loss_falling": losses[-1] < losses[0],
           "peak_gib_measured": peak, "peak_gib_predicted": pred["memory_gib"][name],
           "step_s_predicted": pred["step_s"][name], "step_error": pred["step_s"][name] / step - 1}
    if peak is not None:
        out["peak_error"] = pred["memory_gib"][name] / peak - 1
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def main(argv=None) -> None:
    args = _args(argv)
    device = torch.device("cpu" if args.dry else "cuda")
    capacity = None if args.dry else torch.cuda.get_device_properties(device).total_memory / GIB
    cluster = make_cluster(gpus=1, gpu="h200")
    report = {"torch": torch.__version__, "device": None if args.dry else torch.cuda.get_device_name(0),
              "capacity_gib": capacity, "commit": _commit(), "cluster": cluster.describe(), "warmup": args.warmup,
              "steps": args.steps, "precision": "float32 master weights, bf16 autocast, fused AdamW", "workloads": {}}
    t_start = time.perf_counter()
    for key in args.workloads:
        build = WORKLOADS[key]
        desc, meta_model, _ = build(args, torch.device("cpu"))
        pred = _predictions(meta_model.graph, cluster)
        del meta_model
        entry = {**desc, "auto": pred["auto"], "predicted_breakdown_gib": pred["memory_breakdown_gib"], "plans": {}}
        report["workloads"][key] = entry
        for name in PLANS:
            if capacity is not None and pred["memory_gib"][name] > capacity:
                entry["plans"][name] = {"skipped": f"predicted {pred['memory_gib'][name]:.1f} GiB > {capacity:.1f}",
                                        "peak_gib_predicted": pred["memory_gib"][name]}
            else:
                try:
                    entry["plans"][name] = _run_plan(name, build, pred, args, device)
                except torch.OutOfMemoryError as err:
                    entry["plans"][name] = {"oom": str(err)[:300], "peak_gib_predicted": pred["memory_gib"][name]}
                    torch.cuda.empty_cache()
                except Exception as err:  # record and go on: one broken plan must not lose the others
                    entry["plans"][name] = {"error": f"{type(err).__name__}: {err}"[:500],
                                            "traceback": traceback.format_exc()[-2000:]}
            print(key, name, json.dumps(entry["plans"][name])[:300], flush=True)
            runs = {k: v["peak_gib_measured"] for k, v in entry["plans"].items() if v.get("peak_gib_measured")}
            if {"full", "auto", "selective"} <= set(runs):
                entry["auto"]["measured_full_le_auto_le_selective"] = runs["full"] <= runs["auto"] <= runs["selective"]
            report["wall_s"] = time.perf_counter() - t_start
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out} in {report['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
