"""Wan2.1 DiT training step on one GPU: lf's ``wan_dit`` recipe against diffusers' ``WanTransformer3DModel``.

Both models have the same configuration (``lf_ir.interop.diffusers_wan.diffusers_config_from_wan``; Wan2.1-T2V
1.3B by default), the same batch (one clip of 81 frames at 480x832: 21x60x104 latents, 32,760 tokens after
the 1x2x2 patch, 512 text tokens of width 4096), the same flow-matching objective (``x_t = (1 - s) x0 + s
noise``, timestep ``1000 s``, target ``noise - x0``, mean squared error in float32), float32 master weights
under bf16 autocast, fused AdamW (lr 1e-4) and full activation recomputation per block (lf:
``lf_memory.apply_recompute(model.blocks, "full")``; diffusers: ``enable_gradient_checkpointing()``), because
without it neither fits 141 GB at this length. Attention: lf's dispatcher; diffusers' default processor (PyTorch
SDPA), so both can use the same cuDNN / flash kernels. Each model: ``--warmup`` steps, then the median of
``--steps`` synchronized steps; peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps. Model
TFLOP/s count the IR's forward + backward FLOPs (no recompute) against 989.4 TFLOP/s dense bf16.

    python bench/wan_dit_peer.py --out bench/results/wan_dit_peer_h200.json
    python bench/wan_dit_peer.py --dry --out /tmp/wan_dit_peer_dry.json     # CPU: tiny model, 2 steps

Under torchrun with more than one process both models are sharded with FSDP2 (ZeRO-3) over all ranks, each
rank one clip of its own (seed = rank): lf through lf-parallel (``parallelize`` with ``zero=3,dp=N``,
``precision="bf16"``, recompute applied by ``parallelize``), diffusers with torch's ``checkpoint_wrapper`` and
``fully_shard`` per transformer block and then the root (its own ``enable_gradient_checkpointing`` recomputes
outside FSDP2's input cast and fails), the same ``MixedPrecisionPolicy(param bf16, reduce fp32)``; step time
is the slowest rank's, peak memory the largest rank's, FLOPs per GPU one clip's:

    torchrun --nproc-per-node 2 bench/wan_dit_peer.py --out bench/results/wan_dit_peer_h200x2.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import statistics
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lf_ir import graph_cost, materialize, use_fused_ops
from lf_ir.interop.diffusers_wan import diffusers_config_from_wan
from lf_ir.recipes import wan_dit
from lf_memory import PrecisionPolicy, apply_recompute

GIB = 2 ** 30
PEAK_FLOPS = 989.4e12


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--dry", action="store_true", help="CPU smoke run: tiny model, 2 steps, no warm-up")
    p.add_argument("--size", default="1.3B", help="wan_dit size")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args(argv)
    if args.dry:
        args.size, args.warmup, args.steps = "tiny", 0, 2
    return args


def _batch(cfg, grid, device, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(1, cfg.in_channels, *grid, generator=gen)
    return {"x0": x0.to(device), "noise": torch.randn(x0.shape, generator=gen).to(device),
            "text": torch.randn(1, cfg.text_len, cfg.text_dim, generator=gen).to(device),
            "sigma": torch.tensor([0.6], device=device)}


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _lf(cfg, device, fused: bool = False):
    """lf's recipe, full recompute (under FSDP2 via lf-parallel when distributed), with lf-kernels' fused ops when
    ``fused`` (``model.fused_ops``: RMSNorm, 3D RoPE, adaLN modulate); (model, loss fn, optimizer)."""
    with torch.device("meta"):
        model = wan_dit.WanDiTModel(cfg)
    model = materialize(model, device, seed=0)
    if fused:
        use_fused_ops(model)
    if _world() == 1:
        apply_recompute(model.blocks, "full")
        return model, _lf_loss, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    from lf_parallel import build_mesh, build_optimizer, check_plan, parallelize, parse_plan

    world = _world()
    plan = check_plan(parse_plan(f"zero=3,dp={world}", precision="bf16", micro_batch=1), world_size=world,
                      global_batch=world, graph=model.graph)
    mesh = build_mesh(plan, device.type)
    model = parallelize(model, mesh, plan, recompute=lambda m: apply_recompute(m.blocks, "full"))
    return model, _lf_loss, build_optimizer(model, mesh, plan, lr=1e-4, fused=device.type == "cuda")


def _lf_loss(m, b):
    return m.flow_loss(b["x0"], b["text"], b["noise"], b["sigma"])


def _peer(cfg, device):
    """diffusers' model of the same config, gradient checkpointing on; the same objective written by hand."""
    from diffusers import WanTransformer3DModel

    conf = {k: v for k, v in diffusers_config_from_wan(cfg).items() if not k.startswith("_")}
    model = WanTransformer3DModel(**conf).to(device)
    if _world() == 1:
        model.enable_gradient_checkpointing()
    else:  # diffusers' own checkpointing re-runs blocks outside FSDP2's input cast (dtype mismatch on recompute),
        # so the FSDP2 recipe: torch's checkpoint_wrapper on each block, then fully_shard per block and the root
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (_world(),))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block)
            fully_shard(model.blocks[i], mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)

    def loss(m, b):
        s = b["sigma"].view(-1, 1, 1, 1, 1)
        x_t = (1 - s) * b["x0"] + s * b["noise"]
        pred = m(hidden_states=x_t, timestep=1000 * b["sigma"], encoder_hidden_states=b["text"], return_dict=False)[0]
        return F.mse_loss(pred.float(), (b["noise"] - b["x0"]).float())

    return model, loss, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")


def _measure(build, cfg, batch, args, device) -> dict:
    model, loss_fn, opt = build(cfg, device)
    policy = PrecisionPolicy(torch.float32, torch.bfloat16)
    times, losses = [], []
    try:
        for i in range(args.warmup + args.steps):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                if i == args.warmup:
                    torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            with policy.autocast(device):
                loss = loss_fn(model, batch)
            loss.float().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(_slowest(time.perf_counter() - t0, device))
            losses.append(float(loss.detach().float()))
        peak = _slowest(torch.cuda.max_memory_allocated(device) / GIB, device) if device.type == "cuda" else None
    finally:
        del model, opt
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"step_s_median": statistics.median(times[args.warmup:]), "step_s_timed": times[args.warmup:],
            "losses": losses, "loss_finite": all(math.isfinite(x) for x in losses),
            "loss_falling": losses[-1] < losses[0], "peak_gib": peak}


def _slowest(value: float, device) -> float:
    """The largest ``value`` over the ranks (step time, peak memory); ``value`` itself in one process."""
    if _world() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def main(argv=None) -> None:
    args = _args(argv)
    from lf_parallel import init_distributed, shutdown

    ctx = init_distributed("cpu" if args.dry else "cuda")
    device = ctx.device
    cfg = wan_dit.wan_dit_config(args.size, layers=2) if args.dry else wan_dit.wan_dit_config(args.size)
    grid = (3, 6, 10) if args.dry else (21, 60, 104)
    seq = math.prod(g // p for g, p in zip(grid, cfg.patch, strict=True))
    cost = graph_cost(wan_dit.build_graph(cfg, seq_len=seq), batch=1)
    flops = cost.total("forward_flops") + cost.total("backward_flops")
    batch = _batch(cfg, grid, device, seed=ctx.rank)
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "world_size": _world(), "parallel": f"FSDP2 zero=3 dp={_world()}" if _world() > 1 else "one GPU",
              "model": f"wan_dit {args.size}", "latents": list(grid), "tokens": seq, "text_tokens": cfg.text_len,
              "recompute": "full (both)", "precision": "float32 master weights, bf16 autocast, fused AdamW",
              "flops_per_step": flops, "warmup": args.warmup, "steps": args.steps, "runs": {}}
    try:
        result["diffusers_version"] = version("diffusers")
    except PackageNotFoundError:  # not installed: the diffusers run records the error
        result["diffusers_version"] = None
    for name, build in (("lf", _lf), ("lf_fused", functools.partial(_lf, fused=True)), ("diffusers", _peer)):
        try:
            r = _measure(build, cfg, batch, args, device)
            r["tflops"] = flops / r["step_s_median"] / 1e12
            r["mfu"] = flops / r["step_s_median"] / PEAK_FLOPS
        except Exception as err:  # record and go on: the other model's figures still count
            r = {"error": f"{type(err).__name__}: {err}"[:500], "traceback": traceback.format_exc()[-2000:]}
        result["runs"][name] = r
        if ctx.rank == 0:
            print(name, json.dumps({k: v for k, v in r.items() if k not in ("losses", "step_s_timed")}), flush=True)
    runs = result["runs"]
    if all("step_s_median" in runs[k] for k in ("lf", "diffusers")):
        result["speedup_lf_over_diffusers"] = runs["diffusers"]["step_s_median"] / runs["lf"]["step_s_median"]
    if all("step_s_median" in runs[k] for k in ("lf_fused", "diffusers")):
        fused = runs["lf_fused"]["step_s_median"]
        result["speedup_lf_fused_over_diffusers"] = runs["diffusers"]["step_s_median"] / fused
    if ctx.rank == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    shutdown(ctx)


if __name__ == "__main__":
    main()
