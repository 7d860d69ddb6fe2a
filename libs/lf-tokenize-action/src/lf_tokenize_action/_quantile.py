"""Quantile bin edges for ``BinningTokenizer(binning="quantile")``.

Edges live in normalized units, one row per dimension: ``edges`` is float64
``(D, n_bins + 1)``, strictly increasing along the last axis, ``edges[:, 0] == -1``
and ``edges[:, -1] == +1``. The interior edges are the empirical quantiles
``i / n_bins`` (numpy's default linear method) of the normalized, clipped
fitting data, blended with the uniform edges:

    edges = (1 - QUANTILE_MIX) * quantile_edges + QUANTILE_MIX * linspace(-1, 1, n_bins + 1)

so every bin is at least ``QUANTILE_MIX * 2 / n_bins`` wide and all ``n_bins``
bins stay reachable even when the data has atoms (a gripper sitting at +-1, a
constant dimension), where raw quantiles would repeat and leave empty bins.
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUANTILE_MIX = 1e-3


def quantile_edges(norm_nd: np.ndarray, n_bins: int, mix: float = QUANTILE_MIX) -> np.ndarray:
    """Edges ``(D, n_bins + 1)`` from normalized clipped data ``(N, D)`` in [-1, 1] (see module docstring)."""
    probs = np.linspace(0.0, 1.0, n_bins + 1)
    q = np.quantile(norm_nd, probs, axis=0).T  # (D, n_bins + 1)
    q[:, 0], q[:, -1] = -1.0, 1.0
    edges = (1.0 - mix) * q + mix * np.linspace(-1.0, 1.0, n_bins + 1)
    edges[:, 0], edges[:, -1] = -1.0, 1.0
    return edges


def check_edges(edges: Any, *, n_bins: int, action_dim: int) -> np.ndarray:
    """Validate edges as documented; return them as float64 ``(D, n_bins + 1)``.

    Raises:
        ValueError: wrong shape, non-finite, not starting at -1 / ending at +1, or
            not strictly increasing; the message names the dimension and value.
    """
    try:
        arr = np.array(edges, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"edges must be a float array of shape ({action_dim}, {n_bins + 1}); got {edges!r}") from err
    if arr.shape != (action_dim, n_bins + 1):
        raise ValueError(f"edges must have shape ({action_dim}, {n_bins + 1}) (D, n_bins + 1); got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("edges must be finite; got a NaN or inf")
    if (arr[:, 0] != -1.0).any() or (arr[:, -1] != 1.0).any():
        d = int(np.flatnonzero((arr[:, 0] != -1.0) | (arr[:, -1] != 1.0))[0])
        raise ValueError(f"edges[{d}] must start at -1 and end at +1; got {arr[d, 0]} .. {arr[d, -1]}")
    steps = np.diff(arr, axis=1)
    if (steps <= 0).any():
        d, i = (int(v) for v in np.argwhere(steps <= 0)[0])
        raise ValueError(
            f"edges[{d}] must be strictly increasing; got edges[{d}][{i}]={arr[d, i]} >= edges[{d}][{i + 1}]"
            f"={arr[d, i + 1]}"
        )
    return arr


def digitize(norm: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bins int64 ``(..., D)`` for clipped normalized ``norm (..., D)``: bin i covers ``[edges[d, i], edges[d, i+1])``.

    +1 goes to the last bin, never to ``n_bins``.
    """
    bins = np.empty(norm.shape, dtype=np.int64)
    for d in range(edges.shape[0]):
        bins[..., d] = np.searchsorted(edges[d, 1:-1], norm[..., d], side="right")
    return bins
