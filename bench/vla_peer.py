"""A ~3B VLA training step on 2 GPUs under DDP: lf's ``vla`` / ``vla_flow`` recipes vs the same in transformers.

Variants (``--variant``, default both in one job): ``tokens`` (lf-ir ``vla`` size ``3B``: SigLIP-So400m-shaped
encoder at 224 px, Llama-3.2-3B-shaped backbone, 3.43B parameters) and ``flow`` (``vla_flow`` size ``3B``: pi0's
SigLIP + Gemma-2B-shaped backbone + 300M action expert, 3.13B with this batch's state and action sizes). The peer
of each is ``bench/peers/vla_transformers.py``: ``SiglipVisionModel`` + ``LlamaForCausalLM`` (4D prefix-LM mask)
or ``SiglipVisionModel`` + two ``LlamaModel``s run as pi0's joint attention, random init; the script stops if a
peer's parameter count differs from lf's by more than 0.5% (checked on the meta device at the 3B sizes, every run).

Batch (Meta-World-style, fixed, the same every step so the loss must fall; each rank its own samples):
``--batch`` (32) samples per GPU, one 224x224 uint8 image (256 patches), 16 instruction tokens (2 of them padding
in every other sample), a 39-d state, a 4-step x 4-d action chunk (16 action tokens, or 4 flow tokens with fixed
noise and flow times). Both: float32 master weights, bf16 autocast (lf-memory's ``PrecisionPolicy``), fused AdamW
(lr 1e-4), the same ``--recompute`` (none or full per block: lf ``apply_recompute(model.blocks, "full")``; the peer
HF ``gradient_checkpointing_enable()`` / ``torch.utils.checkpoint`` per joint layer), DDP over the 2 GPUs
(lf: ``lf_parallel.parallelize`` with the plan ``dp=2``; peer: ``DistributedDataParallel``). Each: ``--warmup``
steps, then the median of ``--steps`` synchronized steps (the slowest rank's time per step); peak memory is
``torch.cuda.max_memory_allocated`` over the timed steps, the highest rank. Model TFLOP/s count lf's IR forward +
backward FLOPs per sample (``graph_cost``, no recompute) against 989.4 TFLOP/s dense bf16; tokens are the
backbone's sequence per sample (``cfg.seq_len``). Results are rewritten after every run.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node 2 bench/vla_peer.py --out bench/results/vla_peer_h200x2.json
    python bench/vla_peer.py --dry --out /tmp/vla_peer_dry.json     # CPU: tiny models, 2 gloo ranks, 2 steps
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from lf_ir import graph_cost, materialize
from lf_ir.recipes import vla, vla_flow
from lf_ir.recipes.vla import VLAModel, vla_config
from lf_ir.recipes.vla_flow import VLAFlowModel, vla_flow_config
from lf_memory import apply_recompute, resolve_precision
from lf_parallel import Plan, build_mesh, build_optimizer, check_plan, init_distributed, parallelize, shutdown

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import vla_transformers as peers  # noqa: E402

PEAK_FLOPS = 989.4e12
"""Dense bf16 peak of one H100/H200, FLOP/s (BENCH.md)."""
GIB = 2 ** 30
PARAM_TOLERANCE = 0.005
"""Largest relative parameter-count difference between lf and a peer at the 3B sizes."""
METAWORLD = dict(max_instruction_len=16, state_dim=39, action_dim=4, action_horizon=4)
"""The batch's fields (Meta-World: 16 instruction tokens, 39-d state, 4 x 4 action chunk)."""
VARIANTS = ("tokens", "flow")


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write (rank 0)")
    p.add_argument("--dry", action="store_true", help="CPU smoke run: tiny models, 2 gloo processes, 2 steps")
    p.add_argument("--variant", choices=(*VARIANTS, "both"), default="both")
    p.add_argument("--batch", type=int, default=32, help="samples per GPU per step")
    p.add_argument("--recompute", choices=("none", "full"), default="none", help="the same for lf and the peer")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=None, help="AdamW lr (default 1e-4; 1e-3 with --dry)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout (a hang ends the job)")
    args = p.parse_args(argv)
    if args.dry:
        args.batch, args.warmup, args.steps = 2, 0, 2
    args.lr = args.lr or (1e-3 if args.dry else 1e-4)
    args.variants = list(VARIANTS) if args.variant == "both" else [args.variant]
    return args


def model_config(variant: str, dry: bool):
    """The recipe config of a variant: size ``3B`` with the Meta-World batch fields, or tiny (``--dry``)."""
    if dry:
        small = dict(image_size=32, patch_size=8, mlp_activation="swiglu", **METAWORLD)
        return vla_config("tiny", **small) if variant == "tokens" else vla_flow_config("tiny", **small)
    return vla_config("3B", **METAWORLD) if variant == "tokens" else vla_flow_config("3B", **METAWORLD)


def _models(variant: str):
    return (VLAModel, peers.TokenVLA) if variant == "tokens" else (VLAFlowModel, peers.FlowVLA)


def param_counts(variant: str, cfg) -> tuple[int, int]:
    """(lf, peer) parameter counts of ``cfg``, both built on the meta device."""
    lf_cls, peer_cls = _models(variant)
    with torch.device("meta"):
        return (sum(p.numel() for p in lf_cls(cfg).parameters()), sum(p.numel() for p in peer_cls(cfg).parameters()))


def check_param_counts() -> dict:
    """Both variants' 3B parameter counts, lf and peer; RuntimeError if they differ by more than 0.5%."""
    out = {}
    for variant in VARIANTS:
        n_lf, n_peer = param_counts(variant, model_config(variant, dry=False))
        rel = n_peer / n_lf - 1
        if abs(rel) > PARAM_TOLERANCE:
            raise RuntimeError(f"peer {variant}: {n_peer:,} parameters vs lf's {n_lf:,} ({100 * rel:+.3f}%, "
                               f"more than {100 * PARAM_TOLERANCE}%): not the same model")
        out[variant] = {"lf": n_lf, "peer": n_peer, "relative_difference": rel}
    return out


def make_batch(variant: str, cfg, n: int, rank: int, device) -> dict[str, torch.Tensor]:
    """The fixed batch of one rank (seed ``rank``): the inputs of the recipe's ``training_loss``."""
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, cfg.text_vocab_size, (n, cfg.max_instruction_len), generator=g)
    mask = torch.ones(n, cfg.max_instruction_len, dtype=torch.bool)
    mask[1::2, -2:] = False  # every other sample has 2 padded instruction tokens
    batch = {"image": torch.randint(0, 256, (n, cfg.image_size, cfg.image_size, 3), generator=g, dtype=torch.uint8),
             "instruction_ids": ids * mask, "instruction_mask": mask,
             "state": torch.randn(n, cfg.state_dim, generator=g)}
    if variant == "tokens":
        actions = torch.randint(cfg.text_vocab_size, cfg.vocab_size, (n, cfg.num_action_tokens), generator=g)
        batch.update(action_in_ids=actions[:, :-1], labels=actions)
    else:
        shape = (n, cfg.action_horizon, cfg.action_dim)
        batch.update(actions=torch.randn(shape, generator=g), noise=torch.randn(shape, generator=g),
                     sigma=torch.rand(n, generator=g), action_mask=torch.ones(n, cfg.action_horizon, dtype=torch.bool))
    return {k: v.to(device) for k, v in batch.items()}


class _Loss(nn.Module):
    """``forward(batch)`` = the wrapped model's mean training loss, so DDP wraps the loss computation."""

    def __init__(self, model: nn.Module, lf: bool):
        super().__init__()
        self.model, self.lf = model, lf

    def forward(self, batch):
        if not self.lf:
            return self.model.training_loss(batch)
        loss_sum, _ = self.model.training_loss(batch)
        return loss_sum / self.model.loss_normalizer(batch).clamp(min=1)


def build_lf(variant: str, cfg, args, device):
    """lf's path: recipe on meta -> materialize -> recompute (lf-memory) -> ``parallelize`` (dp plan) -> AdamW."""
    world = dist.get_world_size()
    plan = check_plan(Plan(dp=world, micro_batch=args.batch), world_size=world, global_batch=world * args.batch)
    with torch.device("meta"):
        model = _models(variant)[0](cfg)
    model = materialize(model, device, seed=0)
    mesh = build_mesh(plan, device.type)
    wrapped = parallelize(_Loss(model, lf=True), mesh, plan,
                          recompute=lambda m: apply_recompute(model.blocks, args.recompute))
    opt = build_optimizer(wrapped, mesh, plan, lr=args.lr, fused=device.type == "cuda")
    return wrapped, opt, plan.describe()


def build_peer(variant: str, cfg, args, device):
    """The transformers peer: random init (seed 0), recompute as asked, DDP, fused AdamW."""
    torch.manual_seed(0)
    model = _models(variant)[1](cfg).to(device)
    if args.recompute == "full":
        model.prefix.vision.gradient_checkpointing_enable()
        if variant == "tokens":
            model.llm.gradient_checkpointing_enable()
        else:
            model.checkpoint = True
    ids = [device.index] if device.type == "cuda" else None
    wrapped = nn.parallel.DistributedDataParallel(_Loss(model, lf=False), device_ids=ids)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=args.lr, fused=device.type == "cuda")
    return wrapped, opt, f"DDP over {dist.get_world_size()} ranks"


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(build, variant: str, cfg, batch, args, device) -> dict:
    """Build, run ``warmup + steps`` steps, reduce over ranks; the figures of one implementation."""
    model, opt, parallel = build(variant, cfg, args, device)
    policy = resolve_precision("bf16", device)
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        if i == args.warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _sync(device)
        t0 = time.perf_counter()
        with policy.autocast(device):
            loss = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach().float())
    del model, opt
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    mean_loss = torch.stack(losses).double()
    dist.all_reduce(mean_loss)
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0.0],
                        dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    loss_list = (mean_loss / dist.get_world_size()).tolist()
    return {"parallel": parallel, "step_s_median": statistics.median(t.tolist()[args.warmup:]),
            "step_s_timed": t.tolist()[args.warmup:], "step_s_warmup": t.tolist()[:args.warmup],
            "peak_gib": float(peak) / GIB if device.type == "cuda" else None,
            "first_loss": loss_list[0], "losses": loss_list, "loss_finite": all(math.isfinite(x) for x in loss_list),
            "loss_falling": loss_list[-1] < loss_list[0]}


def rates(r: dict, samples: int, tokens_per_sample: int, flops_per_sample: float) -> dict:
    """Per-GPU rates of one run: samples/s, tokens/s, model TFLOP/s and MFU (989.4 TFLOP/s peak)."""
    per_s = samples / r["step_s_median"]
    return {"samples_per_s_per_gpu": per_s, "tokens_per_s_per_gpu": per_s * tokens_per_sample,
            "tflops_per_gpu": per_s * flops_per_sample / 1e12, "mfu": per_s * flops_per_sample / PEAK_FLOPS}


def _commit() -> dict:
    """The repository's HEAD commit and whether the tree has changes (``LF_COMMIT`` where git is missing)."""
    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": os.environ.get("LF_COMMIT", "unknown"), "dirty": None}


def _run(name: str, fn, device) -> dict:
    """``fn()`` on every rank; any rank's error is recorded (and the others go on to the next run)."""
    out, err = {}, None
    try:
        out = fn()
    except Exception as e:  # record and go on: one failing run must not lose the others
        err = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"[-3000:]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, err)
    if any(errors):
        out = {"error": {f"rank{r}": e for r, e in enumerate(errors) if e}}
    if dist.get_rank() == 0:
        print(f"{name}: " + json.dumps({k: v for k, v in out.items() if not isinstance(v, list)}), flush=True)
    return out


def run(args: argparse.Namespace) -> None:
    """One rank: the parameter check, then per variant lf and the peer; rank 0 writes ``args.out`` after each."""
    ctx = init_distributed("cpu" if args.dry else "cuda", timeout_s=args.timeout_s)
    device, world = ctx.device, ctx.world_size
    import transformers

    result = {"benchmark": "vla_peer", "dry": args.dry, "world_size": world, "batch_per_gpu": args.batch,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "transformers": transformers.__version__, **_commit(),
              "precision": "float32 master weights, bf16 autocast, fused AdamW" if device.type == "cuda" else
              "float32 master weights, bf16 autocast, AdamW", "lr": args.lr, "recompute": args.recompute,
              "peak_flops": PEAK_FLOPS, "warmup": args.warmup, "steps": args.steps,
              "params_3b": check_param_counts(), "variants": {}}

    def write():
        if ctx.is_main:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))

    write()
    for variant in args.variants:
        cfg = model_config(variant, args.dry)
        n_lf, n_peer = param_counts(variant, cfg)
        graph = (vla.build_graph if variant == "tokens" else vla_flow.build_graph)(cfg)
        cost = graph_cost(graph, batch=1)
        flops = cost.total("forward_flops") + cost.total("backward_flops")
        entry = {"model": f"{'vla' if variant == 'tokens' else 'vla_flow'} {'tiny' if args.dry else '3B'}",
                 "config": {k: getattr(cfg, k) for k in cfg.__struct_fields__},
                 "params_lf": n_lf, "params_peer": n_peer, "image_tokens": (cfg.image_size // cfg.patch_size) ** 2,
                 "tokens_per_sample": cfg.seq_len, "flops_per_sample": flops, "runs": {}}
        result["variants"][variant] = entry
        batch = make_batch(variant, cfg, args.batch, dist.get_rank(), device)
        for impl, build in (("lf", build_lf), ("transformers", build_peer)):
            r = _run(f"{variant} {impl}", lambda b=build: measure(b, variant, cfg, batch, args, device), device)  # noqa: B023
            if "step_s_median" in r:
                r.update(rates(r, args.batch, cfg.seq_len, flops))
            entry["runs"][impl] = r
            write()
        runs = entry["runs"]
        if all("step_s_median" in runs[k] for k in ("lf", "transformers")):
            entry["speedup_lf_over_peer"] = runs["transformers"]["step_s_median"] / runs["lf"]["step_s_median"]
        write()
    shutdown(ctx)


def main(argv=None) -> None:
    from _launch import launch  # bench/ is sys.path[0] when this file runs as a script

    launch(run, _args(argv))


if __name__ == "__main__":
    main()
