"""Profiling training steps of `lf run`: ``train.profile_steps = [first, last]``.

:class:`StepProfiler` runs ``torch.profiler`` (CPU activity, and CUDA where the run uses it) over the finished
steps ``first..last`` (1-based, inclusive) on every rank and writes into ``<run>/profile/``:

- ``rank{r}_summary.json``: the profiled steps' wall time per step (s, host clock), the GPU kernel time per
  step by category (matmul, attention, collective communication (NCCL), optimizer, other), the time some
  kernel ran (the union of kernel intervals over all streams), the communication time no compute kernel
  overlapped (*exposed* communication), the GPU idle time per step, and the 25 kernels with the most time
  (``gpu: false`` on a CPU run, whose busy / idle / exposed fields are null);
- ``rank{r}_ops.txt``: ``key_averages()`` as a table, sorted by device time (CPU time on the CPU);
- ``rank0_trace.json.gz`` (rank 0 only): the Chrome / Perfetto trace of those steps.

The categories come from kernel names (cuBLAS / CUTLASS / nvJet GEMMs, FlashAttention / cuDNN / Flex
attention kernels, ``nccl*``, fused / multi-tensor Adam); they are a reading aid for the gap between a measured
step and a prediction, not a cost model. Times are in seconds; kernel intervals come from CUPTI via Kineto. A
collective's kernel runs until every rank has joined it, so its time includes waiting for slower ranks: compare
the ranks' summaries (a rank with much idle time makes the others' communication look long).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["StepProfiler", "kernel_category", "kernel_intervals", "summarize_kernels"]

_CATEGORIES = (
    ("communication", re.compile(r"nccl|all_?gather|reduce_?scatter|all_?reduce|sendrecv", re.I)),
    ("attention", re.compile(r"flash|fmha|attn|attention|sdpa|flex", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|sm\d+_.*(tn|nt|nn|tt)|matmul|mm_", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
)


def kernel_category(name: str) -> str:
    """``"communication"``, ``"attention"``, ``"matmul"``, ``"optimizer"`` or ``"other"`` for a kernel name."""
    return next((cat for cat, pattern in _CATEGORIES if pattern.search(name)), "other")


def _union_s(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def kernel_intervals(events, device_type) -> list[tuple[str, float, float]]:
    """``(name, start_s, end_s)`` of the GPU kernels among profiler ``events`` (``FunctionEvent``s).

    GPU-side user annotations (``nccl:_all_gather_base``, ``Optimizer.step#AdamW.step``) are left out: they span
    kernels that are listed themselves, and counting both would count that time twice."""
    return [(e.name, e.time_range.start * 1e-6, e.time_range.end * 1e-6) for e in events
            if e.device_type == device_type and not getattr(e, "is_user_annotation", False)]


def summarize_kernels(kernels: list[tuple[str, float, float]], steps: int, wall_s: float) -> dict[str, Any]:
    """Per-step kernel figures of profiled steps.

    Args:
        kernels: ``(name, start_s, end_s)`` of every GPU kernel in the window (any clock, seconds).
        steps: steps in the window (> 0).
        wall_s: host wall time of those steps, seconds.

    Returns:
        ``{"steps", "wall_s_per_step", "kernel_s_per_step": {category: s}, "busy_s_per_step",
        "idle_s_per_step", "exposed_communication_s_per_step", "top_kernels": [{name, category, calls,
        total_s_per_step}]}``.
    """
    per = 1.0 / steps
    by_cat: dict[str, float] = {}
    by_name: dict[str, list] = {}
    compute = []
    for name, a, b in kernels:
        cat = kernel_category(name)
        by_cat[cat] = by_cat.get(cat, 0.0) + (b - a)
        entry = by_name.setdefault(name, [0.0, 0, cat])
        entry[0] += b - a
        entry[1] += 1
        if cat != "communication":
            compute.append((a, b))
    busy = _union_s([(a, b) for _, a, b in kernels])
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]
    return {
        "steps": steps,
        "wall_s_per_step": wall_s * per,
        "kernel_s_per_step": {c: t * per for c, t in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "busy_s_per_step": busy * per,
        "idle_s_per_step": max(wall_s - busy, 0.0) * per,
        # communication time no compute kernel overlapped: busy time minus the time some compute kernel ran
        "exposed_communication_s_per_step": (busy - _union_s(compute)) * per,
        "top_kernels": [{"name": n[:160], "category": cat, "calls": int(c / steps), "total_s_per_step": t * per}
                        for n, (t, c, cat) in top],
    }


class StepProfiler:
    """``torch.profiler`` over the finished steps ``first..last`` of a run (module docstring).

    Args:
        steps: ``[]`` (off) or ``[first, last]``, 1-based inclusive step numbers.
        run_dir: the run folder; files go to ``run_dir / "profile"``.
        rank: this process's global rank (file names; rank 0 also writes the trace).
        device_type: ``"cuda"`` adds the CUDA activity.
    """

    def __init__(self, steps: list[int], run_dir: Path, *, rank: int, device_type: str):
        self.first, self.last = (steps[0], steps[1]) if steps else (0, -1)
        self.out, self.rank, self.cuda = Path(run_dir) / "profile", rank, device_type == "cuda"
        self._prof = None
        self._t0 = 0.0

    def step_begins(self, step: int) -> None:
        """Call before computing step ``step`` (1-based)."""
        if step == self.first and self._prof is None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self._prof = profile(activities=activities)
            if self.cuda:
                torch.cuda.synchronize()
            self._prof.start()
            self._t0 = time.perf_counter()

    def step_ends(self, step: int) -> None:
        """Call after step ``step`` finished; at ``last`` the profile stops and its files are written."""
        if self._prof is None or step < self.last:
            return
        if self.cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        prof, self._prof = self._prof, None
        prof.stop()
        self._write(prof, steps=step - self.first + 1, wall_s=wall)

    def close(self) -> None:
        """Stop a profile still running (the run ended early); nothing is written for it."""
        if self._prof is not None:
            self._prof.stop()
            self._prof = None

    def _write(self, prof, *, steps: int, wall_s: float) -> None:
        from torch.autograd import DeviceType

        self.out.mkdir(parents=True, exist_ok=True)
        kernels = kernel_intervals(prof.events(), DeviceType.CUDA)
        summary = {"first_step": self.first, "last_step": self.first + steps - 1, "rank": self.rank,
                   "gpu": self.cuda, **summarize_kernels(kernels, steps, wall_s)}
        if not self.cuda:  # no GPU timeline: busy / idle / exposed figures would read as a 100%-idle GPU
            for key in ("busy_s_per_step", "idle_s_per_step", "exposed_communication_s_per_step"):
                summary[key] = None
        from lf_orchestrator._atomic import atomic_path, write_text_atomic

        write_text_atomic(self.out / f"rank{self.rank}_summary.json", json.dumps(summary, indent=1))
        sort = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        write_text_atomic(self.out / f"rank{self.rank}_ops.txt",
                          prof.key_averages().table(sort_by=sort, row_limit=60, max_name_column_width=90))
        if self.rank == 0:
            raw = self.out / "rank0_trace.json"
            prof.export_chrome_trace(str(raw))
            with atomic_path(self.out / "rank0_trace.json.gz") as tmp, raw.open("rb") as src, \
                    gzip.open(tmp, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
