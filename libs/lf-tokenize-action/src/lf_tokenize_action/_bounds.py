"""Normalization bounds (q01/q99, min/max, mean +- k*std) and the linear map to [-1, 1].

Shared by ``BinningTokenizer`` and ``FastTokenizer``. Shapes: ``D`` = action_dim,
``...`` = any leading dims. ``xp`` is the array module (numpy, or cupy for GPU
batches); only functions that numpy and cupy share are used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._arrays import as_float_array

BOUNDS = ("q01_q99", "min_max", "mean_std")
DEFAULT_STD_K = 3.0
_STATS_KEYS = {"q01_q99": ("q01", "q99"), "min_max": ("min", "max"), "mean_std": ("mean", "std")}


def vector(x: Any, name: str) -> np.ndarray:
    """A finite, non-empty 1-D float64 array, or ValueError naming ``name``."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a 1-D array of floats; got {x!r}") from err
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array; got shape {arr.shape}")
    if not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ValueError(f"{name} must be finite; got {float(arr[i])} at index {i}")
    return arr


def check_bounds_kind(bounds: str, std_k: float) -> None:
    """ValueError unless ``bounds`` is known and ``std_k`` is a finite float > 0."""
    if bounds not in BOUNDS:
        raise ValueError(f"bounds must be one of {sorted(BOUNDS)}; got {bounds!r}")
    if isinstance(std_k, bool) or not isinstance(std_k, (int, float)) or not np.isfinite(std_k) or std_k <= 0:
        raise ValueError(f"std_k must be a finite number > 0; got {std_k!r}")


def _mean_std(mean: np.ndarray, std: np.ndarray, std_k: float) -> tuple[np.ndarray, np.ndarray]:
    if (std < 0).any():
        i = int(np.flatnonzero(std < 0)[0])
        raise ValueError(f"std must be >= 0; got std[{i}]={float(std[i])}")
    return mean - std_k * std, mean + std_k * std


def bounds_from_stats(
    stats: Mapping[str, Sequence[float]], bounds: str, std_k: float = DEFAULT_STD_K
) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` float64 ``(D,)`` from a LeRobot ``meta/stats.json`` action entry.

    ``q01_q99`` -> ``(q01, q99)``; ``min_max`` -> ``(min, max)``;
    ``mean_std`` -> ``(mean - std_k * std, mean + std_k * std)``.

    Raises:
        ValueError: unknown ``bounds``, bad ``std_k``, or a needed key missing (named).
    """
    check_bounds_kind(bounds, std_k)
    lo_key, hi_key = _STATS_KEYS[bounds]
    for key in (lo_key, hi_key):
        if key not in stats:
            raise ValueError(f"stats is missing key {key!r} needed by bounds={bounds!r}; has keys {sorted(stats)}")
    lo, hi = vector(stats[lo_key], f"stats[{lo_key!r}]"), vector(stats[hi_key], f"stats[{hi_key!r}]")
    if bounds == "mean_std":
        return _mean_std(lo, hi, float(std_k))
    return lo, hi


def bounds_from_stats_or_actions(
    source: Any, bounds: str, std_k: float = DEFAULT_STD_K, *, name: str = "stats"
) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` float64 ``(D,)`` from a stats mapping or from a raw action table.

    A ``Mapping`` goes to ``bounds_from_stats``; an array (numpy, torch, cupy or nested
    lists) of shape ``(N, D)`` in action units goes to ``bounds_from_actions`` (the
    same q01/q99, min/max or mean/std a LeRobot ``stats.json`` entry holds).

    Raises:
        TypeError: ``source`` is neither a mapping nor a numeric array (the message names ``name``).
        ValueError: an array that is not ``(N, D)`` with N >= 1 or holds NaN/inf; see ``bounds_from_stats``.
    """
    if isinstance(source, Mapping):
        return bounds_from_stats(source, bounds, std_k)
    if isinstance(source, (str, bytes)) or source is None or np.isscalar(source):
        raise TypeError(
            f"{name} must be a stats mapping (keys q01/q99, min/max or mean/std, each a (D,) list) or an "
            f"(N, D) action array; got {type(source).__name__}"
        )
    arr, _ = as_float_array(source, name=name)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} as an action array must have shape (N, D) with N, D >= 1; got shape {arr.shape}")
    return bounds_from_actions(arr, bounds, std_k)


def bounds_from_actions(arr_nd: np.ndarray, bounds: str, std_k: float = DEFAULT_STD_K) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` float64 ``(D,)`` from a checked action table ``(N, D)``.

    Quantiles use numpy's default (linear) method; the std is the population std (ddof=0).
    """
    check_bounds_kind(bounds, std_k)
    if bounds == "min_max":
        return arr_nd.min(axis=0), arr_nd.max(axis=0)
    if bounds == "mean_std":
        return _mean_std(arr_nd.mean(axis=0), arr_nd.std(axis=0), float(std_k))
    low, high = np.quantile(arr_nd, (0.01, 0.99), axis=0)
    return low, high


def normalize_unclipped(arr: Any, low: Any, high: Any, mask: Any, xp: Any = np) -> tuple[Any, Any]:
    """Unclipped normalized values ``(..., D)`` and the out-of-range mask for a checked array.

    ``2 * (x - low) / (high - low) - 1`` where ``mask``; a constant dimension
    (``low == high``) gives 0 at ``low`` and the sign of ``x - low`` elsewhere, so
    it clips to the end bins; ``mask == False`` passes ``x`` through. Out of range
    means outside ``[low, high]`` (outside ``[-1, 1]`` for pass-through dims).
    """
    span = xp.where(high > low, high - low, 1.0)
    scaled = xp.where(high > low, 2.0 * (arr - low) / span - 1.0, xp.sign(arr - low))
    norm = xp.where(mask, scaled, arr)
    raw_out = (arr < low) | (arr > high)
    norm_out = (arr < -1.0) | (arr > 1.0)
    return norm, xp.where(mask, raw_out, norm_out)


def unnormalize(norm: Any, low: Any, high: Any, mask: Any, xp: Any = np) -> Any:
    """Inverse of the normalization: ``(n + 1) / 2 * (high - low) + low`` where ``mask``, else ``n``."""
    return xp.where(mask, (norm + 1.0) / 2.0 * (high - low) + low, norm)
