"""Communication and pipeline-bubble terms of the cost model: alpha-beta collectives per mesh dim.

A collective over ``n`` ranks moving a tensor of ``nbytes`` (the full, unsharded
size) takes ``steps * alpha + nbytes * factor / busbw`` with the NCCL bus-bandwidth
factors (``nccl-tests`` PERFORMANCE.md): all-reduce ``2 (n-1) / n`` over ``2 (n-1)``
ring steps, all-gather / reduce-scatter / all-to-all ``(n-1) / n`` over ``n - 1``
steps, point-to-point 1 over one step. ``busbw`` is the node's NVLink bus bandwidth
when the group stays inside a node, else the per-GPU network bandwidth (NICs at
80% of line rate). Inside a node, a calibration with measured collectives
(:attr:`Calibration.comm`, :mod:`lf_parallel._calibrate_comm`) supplies alpha and the
bus bandwidth per kind instead of ``alpha_us`` and the GPU catalogue's figure.

The mesh is laid out ``pp, dp_replicate, dp_shard, cp, tp`` (tp innermost, as
:mod:`lf_parallel._mesh`), so a dim of size ``n`` whose inner dims multiply to
``stride`` stays in one node iff ``stride * n <= gpus_per_node``.

Pipeline bubbles (idle time per step, in units of one micro-batch's forward +
backward on a stage): GPipe and 1F1B ``p - 1`` (the fraction ``(p-1)/(m+p-1)`` of
the step), interleaved 1F1B ``(p - 1) / v`` (Narayanan et al. 2021), zero bubble
``(p - 1) / 3`` (ZB-H1: Qi et al. 2023, arXiv 2401.10241, whose bubble is about a
third of 1F1B's at 1F1B's memory).
"""

from __future__ import annotations

from lf_parallel._calibrate import Calibration
from lf_parallel._cluster import Cluster

_NIC_EFFICIENCY = 0.8
_FACTORS = {"all_reduce": (lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1)),
            "all_gather": (lambda n: (n - 1) / n, lambda n: n - 1),
            "reduce_scatter": (lambda n: (n - 1) / n, lambda n: n - 1),
            "all_to_all": (lambda n: (n - 1) / n, lambda n: n - 1),
            "p2p": (lambda n: 1.0, lambda n: 1)}
COLLECTIVES = tuple(_FACTORS)


def mesh_strides(plan) -> dict[str, int]:
    """Mesh dim -> product of the sizes of the dims inside it (tp innermost)."""
    sizes = {"tp": plan.tp, "cp": plan.cp, "dp_shard": plan.dp_shard,
             "dp_replicate": plan.dp // max(plan.dp_shard, 1), "pp": plan.pp}
    strides, inner = {}, 1
    for dim in ("tp", "cp", "dp_shard", "dp_replicate", "pp"):
        strides[dim] = inner
        inner *= sizes[dim]
    return strides


def collective_terms(kind: str, ranks: int) -> tuple[int, float]:
    """``(steps, factor)`` of ``kind`` over ``ranks`` ranks: time is ``steps * alpha + nbytes * factor / busbw``.

    Raises:
        ValueError: an unknown collective.

    Example:
        >>> collective_terms("all_reduce", 4), collective_terms("all_gather", 4)
        ((6, 1.5), (3, 0.75))
    """
    if kind not in _FACTORS:
        raise ValueError(f"unknown collective {kind!r}; expected one of {list(_FACTORS)}")
    factor, steps = _FACTORS[kind]
    return steps(ranks), factor(ranks)


def link_busbw(cluster: Cluster, span: int) -> float:
    """Bus bandwidth in bytes/s of a group spanning ``span`` consecutive ranks (NVLink or network)."""
    if span <= cluster.gpus_per_node:
        return cluster.gpu.nvlink_busbw_gbps * 1e9
    return cluster.inter_node_gbps / 8 * 1e9 * _NIC_EFFICIENCY


def collective_time(kind: str, nbytes: float, ranks: int, *, cluster: Cluster, calibration: Calibration,
                    span: int | None = None) -> float:
    """Seconds for one collective of ``kind`` over ``ranks`` ranks moving ``nbytes`` (unsharded size).

    Args:
        kind: one of :data:`COLLECTIVES`.
        nbytes: the full tensor (all-reduce buffer, all-gather output, p2p message), bytes.
        ranks: group size; 1 costs nothing.
        cluster: sets the link bandwidth.
        calibration: sets alpha; inside a node its measured ``comm`` figures (if any) set alpha and the bus
            bandwidth of ``kind`` (kinds it did not time: its pooled fit).
        span: consecutive ranks the group covers (``stride * ranks``); default ``ranks``.

    Raises:
        ValueError: an unknown collective.
    """
    steps, factor = collective_terms(kind, max(ranks, 1))  # raises on an unknown kind
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    span = span or ranks
    if calibration.comm is not None and span <= cluster.gpus_per_node:
        alpha_us, busbw_gbps = calibration.comm.figures(kind)
        busbw = busbw_gbps * 1e9
    else:
        alpha_us, busbw = calibration.alpha_us, link_busbw(cluster, span)
    return steps * alpha_us * 1e-6 + nbytes * factor / busbw


def bubble_micro_batches(schedule: str, pp: int, virtual: int = 1) -> float:
    """Idle micro-batch slots per step of a stage (see the module docstring).

    Raises:
        ValueError: an unknown schedule.

    Example:
        >>> bubble_micro_batches("1f1b", 4), bubble_micro_batches("interleaved_1f1b", 4, 2)
        (3.0, 1.5)
    """
    if pp <= 1:
        return 0.0
    if schedule in ("gpipe", "1f1b"):
        return float(pp - 1)
    if schedule == "interleaved_1f1b":
        return (pp - 1) / virtual
    if schedule == "zero_bubble":
        return (pp - 1) / 3
    raise ValueError(f"parallel.pp_schedule: unknown schedule {schedule!r}")


def bubble_fraction(schedule: str, pp: int, micro_batches: int, virtual: int = 1) -> float:
    """Share of the step a stage idles: ``b / (m + b)`` with ``b`` = :func:`bubble_micro_batches`.

    Example:
        >>> round(bubble_fraction("1f1b", 4, 8), 4)  # (p-1)/(m+p-1)
        0.2727
    """
    idle = bubble_micro_batches(schedule, pp, virtual)
    return idle / (micro_batches + idle)
