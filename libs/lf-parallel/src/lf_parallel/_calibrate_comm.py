"""Intra-node collectives, measured: time them in a process group and fit the cost model's alpha-beta terms.

:func:`measure_collectives` times ``all_gather_into_tensor``, ``reduce_scatter_tensor`` (``*_single`` from
torch 2.13) and ``all_reduce`` over a few message sizes inside an initialized ``torch.distributed`` group
(NCCL on GPUs, gloo on the CPU), keeps the slowest rank's mean time per call (all-reduce
MAX over ranks, so every rank fits the same numbers), and hands them to :func:`fit_collectives`.

:func:`fit_collectives` is pure: it fits ``t = steps * alpha + nbytes * factor / busbw``, the
model of :func:`lf_parallel._comm_model.collective_time` with its step counts and NCCL
bus-bandwidth factors (:func:`~lf_parallel._comm_model.collective_terms`; nccl-tests
PERFORMANCE.md), by least squares on relative residuals (each size weighs alike, so the
largest messages do not drown alpha), per collective kind and pooled over all kinds. Alpha
is kept non-negative (a negative fit is refitted with alpha = 0).

``nbytes`` is the full, unsharded tensor throughout: the all-gather's output, the
reduce-scatter's input, the all-reduce buffer (as nccl-tests' ``size``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

import numpy as np

from lf_parallel._calibrate import CommCalibration
from lf_parallel._comm_model import collective_terms

MEASURED = ("all_gather", "reduce_scatter", "all_reduce")
"""Collective kinds :func:`measure_collectives` times (the cost model's names)."""
CUDA_SIZES = tuple(1 << p for p in range(20, 29, 2))
"""Default message sizes on GPUs: 1, 4, 16, 64, 256 MiB."""
CPU_SIZES = tuple(1 << p for p in range(12, 23, 2))
"""Default message sizes on the CPU (gloo): 4 KiB .. 4 MiB."""


def _fit(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """``(alpha_s, s_per_byte)`` minimizing ``sum(((steps*a + bytes*b) - t) / t)^2`` with ``a >= 0``.

    ``rows``: ``(steps, nbytes * factor, seconds)``.
    """
    a = np.array([[s / t, x / t] for s, x, t in rows], dtype=np.float64)
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    coef = np.linalg.lstsq(a / scale, np.ones(len(rows)), rcond=None)[0] / scale
    alpha, beta = float(coef[0]), float(coef[1])
    if alpha < 0:
        alpha, beta = 0.0, float(a[:, 1].sum() / (a[:, 1] ** 2).sum())
    return alpha, beta


def fit_collectives(sizes: Sequence[int], times_s: Mapping[str, Sequence[float]], *, ranks: int,
                    gpus_per_node: int | None = None, source: str = "") -> CommCalibration:
    """Fit alpha (us) and bus bandwidth (GB/s) per collective kind and pooled, from timings.

    Args:
        sizes: message sizes (the full, unsharded tensor), bytes; at least two distinct.
        times_s: collective kind (one of :data:`lf_parallel._comm_model.COLLECTIVES`) -> seconds per call,
            one per entry of ``sizes``.
        ranks: group size the timings were taken on (>= 2).
        gpus_per_node: GPUs per node of the machine (default ``ranks``).
        source: what was measured (kept in the result).

    Returns:
        :class:`CommCalibration` with the fits and the raw timings.

    Raises:
        ValueError: ``ranks`` < 2, fewer than two distinct ``sizes``, a kind's times not one positive finite number
            per size, an unknown kind, or timings that do not grow with the message size (no bandwidth to fit).

    Example:
        >>> sizes = [1 << 20, 1 << 24]
        >>> ag = [2e-5 + s * 0.5 / 100e9 for s in sizes]  # 2 ranks: 1 step of 20 us, 100 GB/s
        >>> c = fit_collectives(sizes, {"all_gather": ag}, ranks=2)
        >>> round(c.alpha_us["all_gather"], 6), round(c.busbw_gbps["all_gather"], 6)
        (20.0, 100.0)
    """
    if ranks < 2:
        raise ValueError(f"ranks: expected >= 2 (a collective needs two ranks), got {ranks}")
    if len(set(sizes)) < 2 or any(s <= 0 for s in sizes):
        raise ValueError(f"sizes: expected at least two distinct positive byte counts, got {list(sizes)}")
    if not times_s:
        raise ValueError("times_s: expected at least one collective kind's timings, got none")
    per_kind: dict[str, list[tuple[float, float, float]]] = {}
    for kind, times in times_s.items():
        steps, factor = collective_terms(kind, ranks)
        if len(times) != len(sizes) or not all(0 < t < float("inf") for t in times):
            raise ValueError(f"times_s[{kind!r}]: expected {len(sizes)} positive finite seconds (one per size), "
                             f"got {list(times)}")
        per_kind[kind] = [(steps, s * factor, t) for s, t in zip(sizes, times, strict=True)]
    fits = {kind: _fit(rows) for kind, rows in per_kind.items()}
    pooled = _fit([r for rows in per_kind.values() for r in rows])
    for what, (_, beta) in [*((f"times_s[{k!r}]", f) for k, f in fits.items()), ("times_s (pooled)", pooled)]:
        if not beta > 0:
            raise ValueError(f"{what}: the time does not grow with the message size, so no bus bandwidth can be "
                             "fitted; time larger messages (sizes)")
    return CommCalibration(ranks=ranks, gpus_per_node=gpus_per_node or ranks,
                           alpha_us={k: a * 1e6 for k, (a, _) in fits.items()},
                           busbw_gbps={k: 1 / b / 1e9 for k, (_, b) in fits.items()},
                           pooled_alpha_us=pooled[0] * 1e6, pooled_busbw_gbps=1 / pooled[1] / 1e9,
                           sizes=[int(s) for s in sizes],
                           times_s={k: [float(t) for t in v] for k, v in times_s.items()}, source=source)


def _ops(full, shard, group) -> dict:
    """The timed calls on a full tensor (``size`` bytes) and this rank's shard of it."""
    import torch.distributed as dist

    # torch 2.13 renames them ``*_single`` (the old names warn); same c10d ops
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    return {"all_gather": lambda: gather(full, shard, group=group),
            "reduce_scatter": lambda: scatter(shard, full, group=group),
            "all_reduce": lambda: dist.all_reduce(full, group=group)}


def _mean_call_s(fn, group, warmup: int, repeats: int, cuda: bool) -> float:
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    dist.barrier(group=group)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def measure_collectives(group=None, *, sizes: Sequence[int] | None = None, repeats: int | None = None,
                        warmup: int = 2, dtype=None, gpus_per_node: int | None = None) -> CommCalibration:
    """Time all-gather, reduce-scatter and all-reduce in ``group`` and fit them (:func:`fit_collectives`).

    Every rank of ``group`` must call it (it runs collectives) and gets the same result. Tensors are 1-D
    zeros of ``dtype`` on this rank's GPU (NCCL) or the CPU (other backends).

    Args:
        group: an initialized process group (default: the world), inside one node.
        sizes: full message sizes in bytes, each a multiple of ``ranks * element size`` (default :data:`CUDA_SIZES`
            on NCCL, :data:`CPU_SIZES` otherwise).
        repeats: timed calls per kind and size (default 20 on NCCL, 5 otherwise), after ``warmup`` untimed ones.
        warmup: untimed calls first (NCCL connection set-up, allocator).
        dtype: element type (default ``torch.bfloat16`` on NCCL, ``torch.float32`` otherwise).
        gpus_per_node: GPUs per node (default ``LOCAL_WORLD_SIZE``, else the group size).

    Returns:
        :class:`CommCalibration`: alpha (us) and bus bandwidth (GB/s) per kind and pooled, and the timings.

    Raises:
        RuntimeError: no initialized process group.
        ValueError: a group of one rank, a group larger than ``gpus_per_node`` (it would measure the network),
            ``repeats`` < 1, or a size that does not split evenly over the ranks.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("measure_collectives() needs an initialized process group (torchrun + init_distributed)")
    ranks = dist.get_world_size(group)
    gpus_per_node = gpus_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", ranks))
    if ranks < 2:
        raise ValueError(f"group: expected >= 2 ranks to time collectives, got {ranks}")
    if ranks > gpus_per_node:
        raise ValueError(f"group: {ranks} ranks span more than one node of gpus_per_node={gpus_per_node}; "
                         "the intra-node calibration needs a group inside one node")
    cuda = "nccl" in str(dist.get_backend(group))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
    sizes = tuple(sizes or (CUDA_SIZES if cuda else CPU_SIZES))
    repeats = repeats if repeats is not None else (20 if cuda else 5)
    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    elem = torch.empty((), dtype=dtype).element_size()
    for s in sizes:
        if s <= 0 or s % (ranks * elem):
            raise ValueError(f"sizes: each must be a positive multiple of ranks * element size = {ranks * elem} "
                             f"bytes, got {s}")
    times: dict[str, list[float]] = {kind: [] for kind in MEASURED}
    for size in sizes:
        ops = _ops(torch.zeros(size // elem, dtype=dtype, device=device),
                   torch.zeros(size // elem // ranks, dtype=dtype, device=device), group)
        for kind in MEASURED:
            t = torch.tensor([_mean_call_s(ops[kind], group, warmup, repeats, cuda)], dtype=torch.float64,
                             device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)  # the slowest rank
            times[kind].append(float(t))
        del ops
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    source = (f"measured {dist.get_backend(group)} on {ranks} x {name}, {str(dtype).removeprefix('torch.')}, "
              f"torch {torch.__version__}")
    return fit_collectives(sizes, times, ranks=ranks, gpus_per_node=gpus_per_node, source=source)
