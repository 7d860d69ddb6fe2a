"""Llama-3-8B training throughput of lf-parallel plans on 2 GPUs, against a plain FSDP2 peer in the same job.

Measures, per plan, one training step of Llama-3-8B's shape (lf-ir's ``llama3`` recipe, ``--layers`` of
32 blocks, default all) at S = ``--seq`` (8192), micro-batch 1, bf16 compute, fused AdamW (lr 1e-4, as
the peer), on synthetic tokens (one fixed random batch, the same every step, so the loss must fall):

- ``zero=3,dp=2``: FSDP2 (ZeRO-3), ``MixedPrecisionPolicy`` param bf16 / reduce fp32;
- ``tp=2,sp=1``: tensor + sequence parallel; dp = 1, so no ZeRO wrapper (``check_plan`` only forbids
  ZeRO-0/1 when tp > 1 *and* dp > 1); bf16 autocast over fp32 parameters, vocab-parallel loss;
- ``--compile``: the same FSDP / TP plans with each transformer block ``torch.compile``d (after
  recomputation is applied, before ZeRO wraps the model);
- ``pp=2,schedule=1f1b``: two FLOP-balanced stages, ``--microbatches`` (4) micro-batches of 1 sample per
  step, bf16 autocast over fp32 parameters.

Activation recomputation (``--recompute auto``): the cheapest of ``none`` / ``selective`` / ``full`` whose
lf-memory estimate (``estimate_memory``) fits ``--memory-fraction`` of the GPU; the JSON records the mode
and every estimate next to the measured peak. The peer is ``plain_fsdp2_llama.py`` (BENCH.md; vendored
in ``bench/peers/``): its ``LM`` model wrapped and stepped exactly as its ``llama_fsdp`` does (per-block
``fully_shard``, bf16 params / fp32 reduce, optional ``checkpoint_wrapper`` full AC), timed by the same
loop as the plans. Each variant: ``--warmup`` steps, then the median of ``--steps`` timed steps (per step
the slowest rank's time); peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps, per
rank. MFU follows BENCH.md: FLOPs/token = 6 (N - N_embedding) + 12 L d S, against 989.4 TFLOP/s;
tokens/s/GPU = tokens of the global batch per step / step time / GPUs (a tp group shares one sequence).

All variants run one after the other in one torchrun job (one process group; each plan builds its own
mesh and frees its model before the next). The JSON is rewritten after every variant, so a crash keeps
what was measured. ``--plan`` / ``--peer-ac`` select variants (e.g. to run plan by plan).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node 2 bench/llama3_parallel.py --out bench/results/llama3_parallel_h200x2.json
    python bench/llama3_parallel.py --dry --out /tmp/llama3_parallel_dry.json   # CPU: tiny model, 2 gloo ranks
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import statistics
import subprocess
import time
import traceback
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from lf_ir import Llama3Model, llama3_config, materialize, next_token_loss
from lf_ir.recipes.llama3 import build_graph
from lf_kernels import MaskSpec
from lf_memory import PrecisionPolicy, apply_recompute, estimate_memory
from lf_parallel import (
    build_mesh,
    build_optimizer,
    build_pipeline,
    check_plan,
    init_distributed,
    loss_parallel_context,
    parallelize,
    parse_plan,
    pipeline_step,
    shutdown,
)

PLANS = ("zero=3,dp=2", "tp=2,sp=1", "pp=2,schedule=1f1b")
PEAK_FLOPS = 989.4e12
"""Dense bf16 peak of one H100/H200, FLOP/s (BENCH.md)."""
REPO = Path(__file__).resolve().parents[1]
PEER_PATHS = (REPO / "bench" / "peers" / "plain_fsdp2_llama.py",
              REPO.parent / "shared" / "bench" / "plain_fsdp2_llama.py")
GIB = 2 ** 30


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write (rank 0)")
    p.add_argument("--dry", action="store_true", help="CPU smoke run: tiny llama3, 2 gloo processes, 2 steps")
    p.add_argument("--plan", action="append", help=f"plan to run (repeatable); default {list(PLANS)}")
    p.add_argument("--layers", type=int, default=32, help="Llama-3-8B blocks kept (32 = the full model)")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches per step (pp plans)")
    p.add_argument("--recompute", default="auto", choices=("auto", "none", "selective", "full"))
    p.add_argument("--memory-fraction", type=float, default=0.85, help="share of GPU memory 'auto' may plan for")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=None, help="AdamW lr (default 1e-4; 1e-3 with --dry)")
    p.add_argument("--peer-ac", default="1,0", help="peer variants: comma list of full-AC flags ('' = no peer)")
    p.add_argument("--peer-compile", action="store_true", help="torch.compile the peer's blocks (as its option)")
    p.add_argument("--fp8", choices=("tensorwise", "rowwise"), default=None,
                   help="torchao float8 linears (lf-memory apply_fp8; LM head and small GEMMs stay bf16) in FSDP plans")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each lf transformer block (after recompute, before ZeRO) in FSDP / TP plans")
    p.add_argument("--peer", type=Path, default=None, help="path of plain_fsdp2_llama.py")
    p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout (a hang ends the job)")
    args = p.parse_args(argv)
    args.plans = args.plan or list(PLANS)
    if args.dry:
        args.seq, args.warmup, args.steps, args.layers = 32, 0, 2, 2
        args.recompute = "full" if args.recompute == "auto" else args.recompute
    args.lr = args.lr or (1e-3 if args.dry else 1e-4)
    return args


def model_config(args: argparse.Namespace):
    """Llama-3-8B with ``args.layers`` blocks, or the tiny test size (``--dry``)."""
    return llama3_config("tiny", layers=args.layers) if args.dry else llama3_config("8B", layers=args.layers)


def flops_per_token(cfg, seq: int) -> tuple[int, int, int]:
    """``(N, N_embedding, 6 (N - N_embedding) + 12 L d S)``: parameters, embedding-table parameters and the
    training FLOPs per token of BENCH.md's convention (dense attention term, no recompute)."""
    with torch.device("meta"):
        n = sum(p.numel() for p in Llama3Model(cfg).parameters())
    n_emb = cfg.vocab_size * cfg.dim
    return n, n_emb, 6 * (n - n_emb) + 12 * cfg.layers * cfg.dim * seq


def synthetic_batch(vocab: int, samples: int, seq: int, device) -> torch.Tensor:
    """The fixed token batch (samples, seq) int64 every variant trains on (seed 0, CPU generator)."""
    return torch.randint(0, vocab, (samples, seq), generator=torch.Generator().manual_seed(0)).to(device)


def resolve_plan(text: str, world: int, microbatches: int, graph):
    """Parse a plan (precision bf16, micro-batch 1; ``microbatches`` when pp > 1) and check it."""
    plan = parse_plan(text, precision="bf16", micro_batch=1)
    if plan.pp > 1 and "grad_accum" not in text:
        plan = msgspec.structs.replace(plan, grad_accum=microbatches)
    if plan.pp > 1 and plan.world_size != plan.pp:
        raise ValueError(f"--plan {text!r}: this benchmark runs pipeline plans alone (pp = world size)")
    return check_plan(plan, world_size=world, global_batch=plan.global_batch, graph=graph)


def choose_recompute(graph, plan, args, device) -> tuple[str, dict]:
    """The recompute mode (see the module docstring) and lf-memory's predicted peak GiB per mode."""
    est = {m: estimate_memory(graph, plan, batch=plan.micro_batch, seq=args.seq, precision="bf16",
                              recompute=m).total / GIB for m in ("none", "selective", "full")}
    if args.recompute != "auto":
        return args.recompute, est
    budget = args.memory_fraction * torch.cuda.get_device_properties(device).total_memory / GIB
    return next((m for m, gib in est.items() if gib <= budget), "full"), {**est, "budget": budget}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().reshape(())


def _spmd(plan, args, cfg, device, ids):
    """FSDP / TP(+SP) plans: the lf model through ``parallelize``; returns (step fn, recompute mode, estimates)."""
    graph = build_graph(cfg, seq_len=args.seq)
    mode, est = choose_recompute(graph, plan, args, device)
    with torch.device("meta"):
        model = Llama3Model(cfg, graph)
    model = materialize(model, device, seed=0)
    if args.fp8:
        from lf_memory import apply_fp8, fp8_filter

        apply_fp8(model, args.fp8, module_filter=fp8_filter(min_features=1024, tokens=plan.micro_batch * args.seq))
    mesh = build_mesh(plan, device.type)
    def recompute_then_compile(m):
        apply_recompute(m.blocks, mode)
        if args.compile:  # per block, as torchtitan does: FSDP2's hooks stay outside the compiled regions
            for block in m.blocks:
                block.compile()

    model = parallelize(model, mesh, plan, recompute=recompute_then_compile)
    opt = build_optimizer(model, mesh, plan, lr=args.lr, fused=True)  # one fused group per tensor kind
    dp_rank = mesh["dp_shard"].get_local_rank() if plan.zero_stage >= 2 else 0
    local = ids[dp_rank * plan.micro_batch:(dp_rank + 1) * plan.micro_batch]
    fsdp_bf16 = plan.zero_stage >= 2  # FSDP2 casts the parameters; without it, autocast does
    policy = PrecisionPolicy(torch.float32, torch.float32 if fsdp_bf16 else torch.bfloat16)

    def step():
        with loss_parallel_context():
            with policy.autocast(device):
                loss = next_token_loss(model(local), local)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return _local(loss)

    compute = "FSDP2 MixedPrecisionPolicy(param bf16, reduce fp32)" if fsdp_bf16 else \
        "bf16 autocast over fp32 parameters"
    return step, mode, est, compute


def _pipeline(plan, args, cfg, device, ids):
    """A pp plan: this rank's stage on a torch.distributed.pipelining schedule, bf16 autocast."""
    graph = build_graph(cfg, seq_len=args.seq)
    mode, est = choose_recompute(graph, plan, args, device)
    rank = dist.get_rank()
    sched, modules = build_pipeline(graph, pp_rank=rank, pp=plan.pp, schedule=plan.pp_schedule,
                                    n_microbatches=plan.grad_accum, loss_fn=next_token_loss,
                                    mask=MaskSpec(kind="causal"),
                                    device=device, seed=0, virtual_stages=plan.pp_virtual_stages)
    for module in modules:
        apply_recompute(module.components[module.spec.trunk].blocks, mode)
    opt = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=args.lr, fused=True)
    policy = PrecisionPolicy(torch.float32, torch.bfloat16)

    def step():
        with policy.autocast(device):
            losses = pipeline_step(sched, pp_rank=rank, pp=plan.pp, inputs=(ids,), target=ids)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return torch.stack(losses).mean().detach().float() if losses else None

    return step, mode, est, "bf16 autocast over fp32 parameters"


def _peer(ac: bool, args, cfg, device, ids):
    """The peer's LM, wrapped and stepped as its ``llama_fsdp`` does (on our batch, our timing loop)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    path = args.peer or next((p for p in PEER_PATHS if p.exists()), None)
    if path is None or not Path(path).exists():
        raise FileNotFoundError(f"--peer: plain_fsdp2_llama.py not found at {args.peer or list(map(str, PEER_PATHS))}")
    spec = importlib.util.spec_from_file_location("plain_fsdp2_llama", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    with torch.device("meta"):
        m = peer.LM(cfg.vocab_size, cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn_hidden)
    if ac:
        for i, layer in enumerate(m.layers):
            m.layers[i] = checkpoint_wrapper(layer)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in m.layers:
        if args.peer_compile:
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(m, mesh=mesh, mp_policy=mp)
    m.to_empty(device=device)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else torch.nn.init.ones_(p)
    opt = torch.optim.AdamW(m.parameters(), lr=args.lr, fused=True)
    local = ids[dist.get_rank():dist.get_rank() + 1]

    def step():
        logits = m(local)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, cfg.vocab_size),
                                                 local[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().float()

    return step


def _timed(step, args, device) -> tuple[list[float], list]:
    """Run ``warmup + steps`` steps; per-step wall time (synchronized) and local losses (None off the last stage)."""
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        if i == args.warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _sync(device)
        t0 = time.perf_counter()
        loss = step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    return times, losses


def _summary(times, losses, tokens_per_step: int, flops_tok: int, args, device) -> dict:
    """Reduce over ranks (slowest rank per step, mean loss over the ranks that hold one) and derive the rates."""
    world = dist.get_world_size()
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    vals = torch.tensor([0.0 if x is None else float(x) for x in losses], dtype=torch.float64, device=device)
    have = torch.tensor([0.0 if x is None else 1.0 for x in losses], dtype=torch.float64, device=device)
    dist.all_reduce(vals)
    dist.all_reduce(have)
    loss = (vals / have).tolist()
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0], device=device,
                        dtype=torch.float64)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    timed = t.tolist()[args.warmup:]
    step_s = statistics.median(timed)
    tps = tokens_per_step / step_s / world
    timed_loss = loss[args.warmup:]
    return {"step_s_median": step_s, "step_s_timed": timed, "step_s_warmup": t.tolist()[:args.warmup],
            "tokens_per_step": tokens_per_step, "tokens_per_s_per_gpu": tps,
            "tflops_per_gpu": flops_tok * tps / 1e12, "mfu": flops_tok * tps / PEAK_FLOPS,
            "peak_mem_gib_per_rank": [float(p) / GIB for p in peaks],
            "peak_mem_gib": max(float(p) for p in peaks) / GIB,
            "losses": loss, "loss_finite": all(math.isfinite(x) for x in loss),
            "loss_falling": len(timed_loss) > 1 and timed_loss[-1] < timed_loss[0]}


def _run_variant(name: str, build, args, device, tokens_per_step: int, flops_tok: int) -> dict:
    """Build and time one variant; every rank returns its error (None if fine) so rank 0 can record both."""
    out, err, built, step = {}, None, None, None
    try:
        built = build()
        step, extra = (built, {}) if callable(built) else (built[0], dict(zip(("recompute", "predicted_peak_gib",
                                                                              "compute"), built[1:], strict=True)))
        times, losses = _timed(step, args, device)
        built = step = None  # free the model and optimizer before the collectives below
        out = {**extra, **_summary(times, losses, tokens_per_step, flops_tok, args, device)}
    except Exception as e:  # record and go on: one failing variant must not lose the others
        err = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
    built = step = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, err)
    if any(errors):
        out["error"] = {f"rank{r}": e for r, e in enumerate(errors) if e}
    if dist.get_rank() == 0:
        print(f"{name}: " + json.dumps({k: v for k, v in out.items() if not isinstance(v, list)}), flush=True)
    return out


def _commit() -> dict:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": os.environ.get("LF_COMMIT", "unknown"), "dirty": None}


def run(args: argparse.Namespace) -> None:
    """One rank of the job: every plan, then every peer variant; rank 0 writes ``args.out`` after each."""
    ctx = init_distributed("cpu" if args.dry else "cuda", timeout_s=args.timeout_s)
    device, world = ctx.device, ctx.world_size
    cfg = model_config(args)
    n, n_emb, flops_tok = flops_per_token(cfg, args.seq)
    result = {"model": "llama3-tiny" if args.dry else f"llama3-8B shape, {cfg.layers} of 32 layers",
              "layers": cfg.layers, "params": n, "params_embedding": n_emb, "seq": args.seq, "micro_batch": 1,
              "flops_per_token": flops_tok, "peak_flops": PEAK_FLOPS, "world_size": world, "dry": args.dry,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, **_commit(), "optimizer": f"AdamW fused lr={args.lr}",
              "data": "synthetic: one fixed random batch (seed 0), the same every step",
              "warmup": args.warmup, "steps": args.steps, "plans": {}, "peer": {}}
    graph = build_graph(cfg, seq_len=args.seq)

    def write():
        if ctx.is_main:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))

    for text in args.plans:
        try:
            plan = resolve_plan(text, world, args.microbatches, graph)
        except ValueError as e:  # PlanError is a ValueError; same on every rank
            result["plans"][text] = {"error": str(e)}
            write()
            continue
        ids = synthetic_batch(cfg.vocab_size, plan.dp * plan.micro_batch * plan.grad_accum, args.seq, device)
        fn = _pipeline if plan.pp > 1 else _spmd
        out = _run_variant(text, lambda: fn(plan, args, cfg, device, ids), args, device,  # noqa: B023
                           ids.numel(), flops_tok)
        key = text + (" compiled blocks" if args.compile and plan.pp == 1 else "") + \
            (f" fp8 {args.fp8}" if args.fp8 and plan.pp == 1 else "")
        result["plans"][key] = {"plan": plan.describe(), "compiled_blocks": args.compile and plan.pp == 1,
                                "fp8": args.fp8 if plan.pp == 1 else None, **out}
        write()
    ids = synthetic_batch(cfg.vocab_size, world, args.seq, device)
    for flag in filter(None, args.peer_ac.split(",")):
        ac = flag.strip() == "1"
        name = f"fsdp2 {'full AC' if ac else 'no AC'}{', compiled blocks' if args.peer_compile else ', eager'}"
        out = _run_variant(f"peer {name}", lambda: _peer(ac, args, cfg, device, ids), args, device,  # noqa: B023
                           ids.numel(), flops_tok)
        result["peer"][name] = out
        write()
    _ratios(result)
    write()
    shutdown(ctx)


def _ratios(result: dict) -> None:
    """tokens/s/GPU of each plan over each peer variant's (same job, same shapes)."""
    for out in result["plans"].values():
        if "tokens_per_s_per_gpu" in out:
            out["vs_peer"] = {k: out["tokens_per_s_per_gpu"] / p["tokens_per_s_per_gpu"]
                              for k, p in result["peer"].items() if "tokens_per_s_per_gpu" in p}


def main(argv=None) -> None:
    from _launch import launch  # bench/ is sys.path[0] when this file runs as a script

    launch(run, _args(argv))


if __name__ == "__main__":
    main()
