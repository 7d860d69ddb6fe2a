"""Where one training step's time goes on one GPU: step time, GPU-busy share, host syncs and top kernels.

For the reduced Llama-3-8B / Qwen2-VL-7B / Wan2.1-1.3B workloads of ``bench/autotune_check.py``
(``bench/_autotune_models.py``), one plan each (micro-batch, gradient accumulation, recompute mode), with
lf-kernels' fused ops off and on (``lf_ir.use_fused_ops``, what ``model.fused_ops`` switches):

- ``step_s``: median of ``--steps`` timed steps after ``--warmup`` (bf16 autocast over float32 master
  weights, fused AdamW, CUDA-synchronized at the step's ends), ``peak_gib``: ``max_memory_allocated``;
- from ``torch.profiler`` over ``--profile-steps`` more steps: ``gpu_busy_s`` per step (the union of the
  kernel intervals on the GPU timeline), ``gpu_busy_fraction`` = busy / step wall, ``host_syncs`` per step
  (``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` / ``cudaEventSynchronize`` / synchronous
  ``cudaMemcpy`` calls the host waited in), ``kernel_launches`` per step, and the ``top_kernels`` by GPU time;
- with ``--memory-peak N``: one more step under CUDA memory-history recording, and the allocations alive at
  its peak (made during that step) grouped by the allocating line in lf's code, the N largest.

A GPU-busy fraction well under 1 with few syncs says the host launches too slowly (per-module Python and
autograd cost); many syncs say the host waits on the GPU and then the GPU waits on the host. This is how the
auto-tuner's host-overhead error and the fused-op gain are measured (issues 5, 7, 11).

Usage (one GPU)::

    python bench/step_anatomy.py --out bench/results/step_anatomy_h200.json
    python bench/step_anatomy.py --case qwen2_vl:1:4:none --out /tmp/q.json   # model:micro_batch:accum:recompute
    python bench/step_anatomy.py --dry --out /tmp/a.json                       # CPU, tiny models, no profiler

Prints one JSON line per (case, fused); ``--out`` gets ``{device, torch, rows}``, rewritten after each.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from lf_ir import materialize, use_fused_ops
from lf_memory import apply_recompute

GIB = 1024 ** 3
HERE = Path(__file__).resolve().parent
DEFAULT_CASES = ("llama3:2:2:none", "qwen2_vl:1:4:none", "qwen2_vl:2:2:none", "wan_dit:2:1:none")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaEventSynchronize")
"""Host calls counted as syncs (``cudaMemcpyAsync`` excluded: it returns before the copy ends)."""


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


MODELS = _load("_autotune_models")


RECOMPUTE = ("none", "selective", "full")


def _case(text: str) -> tuple[str, int, int, str]:
    """``model:micro_batch:grad_accum:recompute`` -> a checked tuple (argparse type)."""
    parts = text.split(":")
    if (len(parts) != 4 or parts[0] not in MODELS.WORKLOADS or not all(p.isdigit() and int(p) > 0 for p in parts[1:3])
            or parts[3] not in RECOMPUTE):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected model:micro_batch:grad_accum:recompute with model one of "
            f"{sorted(MODELS.WORKLOADS)}, positive integers, recompute one of {RECOMPUTE}")
    return parts[0], int(parts[1]), int(parts[2]), parts[3]


def _fused(text: str) -> list[bool]:
    """``0,1`` -> [False, True] (argparse type)."""
    items = text.split(",")
    if not items or any(i not in ("0", "1") for i in items):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of 0 (off) and 1 (on)")
    return [i == "1" for i in items]


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write (rewritten after every case)")
    p.add_argument("--case", action="append", type=_case,
                   help=f"model:micro_batch:grad_accum:recompute, repeatable; default {DEFAULT_CASES}")
    p.add_argument("--fused", type=_fused, default="0,1",
                   help="comma list of fused-op settings to run per case (0 off, 1 on)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (--dry: 0)")
    p.add_argument("--steps", type=int, default=4, help="timed steps; step_s is their median (--dry: 1)")
    p.add_argument("--profile-steps", type=int, default=2, help="steps under torch.profiler afterwards (0: none)")
    p.add_argument("--memory-peak", type=int, default=0,
                   help="record one more step's CUDA memory history; report this many allocation sites at its peak")
    p.add_argument("--dry", action="store_true", help="tiny models on the CPU, 1 step, no profiler")
    return p.parse_args(argv)


def _busy_union(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals (any unit)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _profile(step, n: int) -> dict:
    """Run ``step`` ``n`` times under the profiler; per-step GPU busy time, syncs, launches, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / n
    kernels, syncs, launches, by_name = [], 0, 0, {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append((ev.time_range.start, ev.time_range.end))
            by_name[ev.name] = by_name.get(ev.name, 0.0) + ev.time_range.elapsed_us()
        elif ev.name.startswith(SYNC_CALLS) and "Async" not in ev.name:
            syncs += 1
        elif ev.name in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"):
            launches += 1
    busy = _busy_union(kernels) / 1e6 / n
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {"profiled_step_s": wall, "gpu_busy_s": busy, "gpu_busy_fraction": busy / wall,
            "host_syncs": syncs / n, "kernel_launches": launches / n,
            "top_kernels": [{"name": k[:120], "ms_per_step": v / 1e3 / n} for k, v in top]}


def _user_frame(frames: list[dict]) -> str:
    """The innermost frame in lf's code (``lf_*`` packages or ``bench/``), else the innermost one."""
    for f in frames:
        name = f.get("filename", "")
        if "/lf_" in name or "/bench/" in name:
            return f"{name.rsplit('/', 2)[-2]}/{name.rsplit('/', 1)[-1]}:{f.get('line')} {f.get('name')}"
    return f"{frames[0].get('filename', '?')}:{frames[0].get('line')}" if frames else "?"


def _memory_peak(step, top: int) -> dict:
    """One ``step`` under CUDA memory-history recording: the live allocations at its peak, grouped by the
    allocating frame in lf's code (``torch.cuda.memory._record_memory_history``)."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    try:
        step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for e in snap["device_traces"][torch.cuda.current_device()]
              if e["action"] in ("alloc", "free_completed")]
    live = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated")  # what outlives the step (params, grads, optimizer state)
    return _peak_alive(events, live, top)


def _peak_alive(events: list[dict], live_after: int, top: int) -> dict:
    """Replay ``alloc`` / ``free_completed`` events (bytes ``size``, ``addr``, ``frames``) of one step that
    ends with ``live_after`` bytes allocated: the peak and what was allocated in the step and alive at it."""
    base = live_after - sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in events)
    cur, peak, at = base, base, -1
    for i, e in enumerate(events):
        cur += e["size"] if e["action"] == "alloc" else -e["size"]
        if cur > peak:
            peak, at = cur, i
    alive: dict[int, dict] = {}
    for e in events[:at + 1]:
        if e["action"] == "alloc":
            alive[e["addr"]] = e
        else:
            alive.pop(e["addr"], None)
    groups: dict[str, list] = {}
    for e in alive.values():
        g = groups.setdefault(_user_frame(e.get("frames", [])), [0, 0])
        g[0], g[1] = g[0] + e["size"], g[1] + 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
    return {"peak_gib": peak / GIB, "held_before_step_gib": base / GIB,
            "allocated_in_step_alive_at_peak": [{"frame": k, "gib": v[0] / GIB, "count": v[1]} for k, v in ranked]}


def measure(args, model_name: str, mb: int, accum: int, recompute: str, fused: bool, device) -> dict:
    work = MODELS.WORKLOADS[model_name](None, None, args.dry)
    with torch.device("meta"):
        model = work.build()
    model = materialize(model, device, seed=0)
    capable = use_fused_ops(model, fused)  # modules with a fused path (switched on or off)
    apply_recompute(torch.nn.ModuleList(model.blocks), recompute)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    batches = [work.batch(mb, i, device.type) for i in range(accum)]

    def step() -> float:
        total = torch.zeros((), device=device)
        for b in batches:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = work.loss(model, b) / accum
            loss.backward()
            total += loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    times = []
    for i in range(args.warmup + args.steps):
        if cuda:
            torch.cuda.synchronize()
            if i == args.warmup:
                torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = float(step())
        times.append(time.perf_counter() - start)
    row = {"model": work.name, "micro_batch": mb, "grad_accum": accum, "recompute": recompute, "fused_ops": fused,
           "fused_capable_modules": capable, "step_s": statistics.median(times[args.warmup:]),
           "step_s_timed": times[args.warmup:], "last_loss": loss,
           "peak_gib": torch.cuda.max_memory_allocated() / GIB if cuda else 0.0}
    if cuda and args.profile_steps > 0:
        row.update(_profile(step, args.profile_steps))
    if cuda and args.memory_peak:
        row["memory_peak"] = _memory_peak(step, args.memory_peak)
    return row  # the model, optimizer and batches are freed with this frame (main empties the CUDA cache)


def main(argv=None) -> None:
    args = _args(argv)
    if args.dry:
        args.warmup, args.steps, args.profile_steps = 0, 1, 0
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry else "cpu")
    rows, name = [], torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    for model_name, mb, accum, recompute in args.case or [_case(c) for c in DEFAULT_CASES]:
        for fused in args.fused:
            row = measure(args, model_name, mb, accum, recompute, fused, device)
            gc.collect()  # the last model's recompute wrappers are reference cycles; free them before the next
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(json.dumps({k: v for k, v in row.items() if k != "top_kernels"}), flush=True)
            rows.append(row)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps({"device": name, "torch": torch.__version__, "rows": rows}, indent=1))
            tmp.replace(args.out)


if __name__ == "__main__":
    main()
