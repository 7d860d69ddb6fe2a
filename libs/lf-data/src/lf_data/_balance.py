"""Data-parallel load balancing by predicted compute cost, not by sample count.

A sample (or packed document) of ``l`` tokens costs ``a * l + b * l**2``: the
linear term is the dense layers (``6 * N`` FLOPs per token for training), the
quadratic one attention (``12 * L * d_attn`` per token pair, the dense PaLM /
torchtitan convention of lf's MFU). Samples go to ranks by greedy
longest-processing-time (Graham 1969): largest cost first, each to the least
loaded rank. Then every rank's load is at most ``mean + max_cost`` (when the
last sample lands on the most loaded rank, that rank held at most the mean),
so the imbalance ``max / mean - 1`` is below ``max_cost / mean``: within 5%
whenever no single sample costs more than 5% of a rank's share.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["balance_by_cost", "cost_coefficients", "imbalance", "row_costs", "sample_costs"]


def cost_coefficients(num_params: int, num_layers: int, d_attn: int, *,
                      embedding_params: int = 0) -> tuple[float, float]:
    """``(a, b)`` training FLOPs per token and per token pair: ``6 (N - N_emb)`` and ``12 L d_attn``."""
    return 6.0 * (num_params - embedding_params), 12.0 * num_layers * d_attn


def sample_costs(lengths: Sequence[int] | np.ndarray, a: float = 1.0, b: float = 0.0) -> np.ndarray:
    """float64 ``(n,)`` predicted cost ``a * l + b * l**2`` of samples of ``lengths`` tokens."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if (lengths < 0).any():
        raise ValueError(f"lengths must be >= 0, got min {lengths.min()}")
    return a * lengths + b * lengths**2


def row_costs(document_ids: torch.Tensor, a: float = 1.0, b: float = 0.0) -> np.ndarray:
    """float64 ``(rows,)`` cost of packed rows: the sum of their documents' costs (padding is free).

    Args:
        document_ids: int ``(rows, seq)`` as made by ``pack_sequences`` (-1 on padding).
    """
    out = np.zeros(document_ids.shape[0])
    for r, row in enumerate(document_ids.cpu().numpy()):
        lengths = np.bincount(row[row >= 0])
        out[r] = sample_costs(lengths, a, b).sum()
    return out


def balance_by_cost(costs: Sequence[float] | np.ndarray, world_size: int) -> list[list[int]]:
    """Assign items to ``world_size`` ranks so predicted costs per rank are near equal (greedy LPT).

    Deterministic: ties are broken by item index and rank. Each rank's list is in
    increasing item order.

    Raises:
        ValueError: ``world_size < 1`` or a negative / non-finite cost.

    Example:
        >>> balance_by_cost([5, 1, 1, 1, 1, 1], 2)
        [[0], [1, 2, 3, 4, 5]]
    """
    if int(world_size) < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    c = np.asarray(costs, dtype=np.float64)
    if not np.isfinite(c).all() or (c < 0).any():
        raise ValueError("costs must be finite and >= 0")
    heap = [(0.0, r) for r in range(world_size)]
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(c)), key=lambda i: (-c[i], i)):
        load, r = heapq.heappop(heap)
        out[r].append(i)
        heapq.heappush(heap, (load + c[i], r))
    return [sorted(x) for x in out]


def imbalance(costs: Sequence[float] | np.ndarray, assignment: Sequence[Sequence[int]]) -> float:
    """``max(rank cost) / mean(rank cost) - 1`` (0 = perfect)."""
    c = np.asarray(costs, dtype=np.float64)
    loads = np.array([c[list(a)].sum() for a in assignment])
    return float(loads.max() / loads.mean() - 1.0) if loads.mean() > 0 else 0.0
