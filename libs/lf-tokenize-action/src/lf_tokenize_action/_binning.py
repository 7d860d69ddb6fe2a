"""Uniform binning action tokenizer (OpenVLA-style, Kim et al. 2024, arXiv:2406.09246, sec. 3.2).

Each action dimension is mapped linearly from ``[low, high]`` (action units,
q01/q99 by default) to ``[-1, 1]``, clipped, and cut into exactly ``n_bins``
bins of width ``w = 2 / n_bins``: bin ``i`` covers ``[-1 + i*w, -1 + (i+1)*w)``
and the value ``+1`` goes to bin ``n_bins - 1``. Decoding returns bin centres.
OpenVLA's own code uses ``n_bins`` *edges* instead, which leaves ``n_bins - 1``
effective bins; the README compares the two layouts.

Shapes: ``D`` = action_dim; ``...`` = any leading dims (batch, time).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._arrays import as_float_array, as_int_array, from_numpy
from ._io import check_header, read_json, write_json_atomic

FORMAT = "lf-tokenize-action/binning"
VERSION = 1
_BOUNDS_KEYS = {"q01_q99": ("q01", "q99"), "min_max": ("min", "max")}
_QUANTILES = {"q01_q99": (0.01, 0.99)}


def _vector(x: Any, name: str) -> np.ndarray:
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


class BinningTokenizer:
    """Per-dimension normalization to [-1, 1] then ``n_bins`` uniform bins.

    Args:
        low, high: float arrays ``(D,)``, normalization bounds in action units
            (q01/q99 when built by ``fit``/``from_actions``). ``low == high`` is
            allowed (a constant dimension: ``low`` normalizes to 0, every bin decodes
            to ``low``; values off it clip to the end bins).
        n_bins: number of bins per dimension, >= 2.
        normalize_mask: optional bool ``(D,)``; ``False`` marks a dimension that
            is *not* normalized: it is taken raw, assumed already in [-1, 1]
            (e.g. a gripper), and its ``low``/``high`` are ignored. Default all True.

    Raises:
        ValueError: shapes differ or are not 1-D, ``low > high`` anywhere,
            non-finite bounds, or ``n_bins < 2``; the message names the field and value.

    Example:
        >>> tok = BinningTokenizer([0.0, -2.0], [1.0, 2.0], n_bins=4)
        >>> tok.encode([[0.5, 2.0]]).tolist()
        [[2, 3]]
        >>> tok.decode([[2, 3]]).tolist()
        [[0.625, 1.5]]
    """

    def __init__(self, low: Any, high: Any, *, n_bins: int = 256, normalize_mask: Any = None) -> None:
        if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 2:
            raise ValueError(f"n_bins must be an int >= 2; got {n_bins!r}")
        low_, high_ = _vector(low, "low"), _vector(high, "high")
        if low_.shape != high_.shape:
            raise ValueError(f"low and high must have the same shape; got {low_.shape} and {high_.shape}")
        if (low_ > high_).any():
            i = int(np.flatnonzero(low_ > high_)[0])
            raise ValueError(
                f"low must be <= high elementwise; got low[{i}]={float(low_[i])} > high[{i}]={float(high_[i])}"
            )
        if normalize_mask is None:
            mask = np.ones(low_.shape, dtype=bool)
        else:
            mask = np.asarray(normalize_mask)
            if mask.dtype != np.bool_ or mask.shape != low_.shape:
                raise ValueError(
                    f"normalize_mask must be a bool array of shape {low_.shape}; "
                    f"got dtype {mask.dtype}, shape {mask.shape}"
                )
        self.n_bins: int = int(n_bins)
        self.low: np.ndarray = low_
        self.high: np.ndarray = high_
        self.normalize_mask: np.ndarray = mask.copy()
        self._span = np.where(high_ > low_, high_ - low_, 1.0)
        self._edges = np.linspace(-1.0, 1.0, self.n_bins + 1)

    # ------------------------------------------------------------------ building
    @classmethod
    def fit(
        cls,
        stats: Mapping[str, Sequence[float]],
        *,
        n_bins: int = 256,
        bounds: str = "q01_q99",
        normalize_mask: Any = None,
    ) -> BinningTokenizer:
        """Build from a LeRobot ``meta/stats.json`` action entry (keys mean, std, min, max, q01, q99).

        ``bounds="q01_q99"`` uses ``stats["q01"]``/``stats["q99"]`` (OpenVLA's choice);
        ``"min_max"`` uses ``stats["min"]``/``stats["max"]``. Other keys are ignored.

        Raises:
            ValueError: unknown ``bounds``, or a needed key missing (the message names it).

        Example:
            >>> BinningTokenizer.fit({"q01": [-1.0], "q99": [3.0]}, n_bins=8).high.tolist()
            [3.0]
        """
        if bounds not in _BOUNDS_KEYS:
            raise ValueError(f"bounds must be one of {sorted(_BOUNDS_KEYS)}; got {bounds!r}")
        lo_key, hi_key = _BOUNDS_KEYS[bounds]
        for key in (lo_key, hi_key):
            if key not in stats:
                raise ValueError(
                    f"stats is missing key {key!r} needed by bounds={bounds!r}; has keys {sorted(stats)}"
                )
        return cls(stats[lo_key], stats[hi_key], n_bins=n_bins, normalize_mask=normalize_mask)

    @classmethod
    def from_actions(
        cls, actions: Any, *, n_bins: int = 256, bounds: str = "q01_q99", normalize_mask: Any = None
    ) -> BinningTokenizer:
        """Build from a table of actions ``(N, D)`` float: per-dimension 1%/99% quantiles or min/max.

        Quantiles use numpy's default (linear interpolation) method.

        Raises:
            ValueError: ``actions`` not 2-D with N >= 1, non-finite values, unknown ``bounds``.
        """
        if bounds not in _BOUNDS_KEYS:
            raise ValueError(f"bounds must be one of {sorted(_BOUNDS_KEYS)}; got {bounds!r}")
        arr, _ = as_float_array(actions, name="actions")
        if arr.ndim != 2 or arr.shape[0] == 0:
            raise ValueError(f"actions must have shape (N, D) with N >= 1; got shape {arr.shape}")
        if bounds == "min_max":
            low, high = arr.min(axis=0), arr.max(axis=0)
        else:
            low, high = np.quantile(arr, _QUANTILES[bounds], axis=0)
        return cls(low, high, n_bins=n_bins, normalize_mask=normalize_mask)

    # ------------------------------------------------------------------ layout
    @property
    def action_dim(self) -> int:
        """Number of action dimensions D."""
        return int(self.low.shape[0])

    @property
    def bin_width(self) -> float:
        """Bin width in normalized units, ``2 / n_bins``."""
        return 2.0 / self.n_bins

    @property
    def bin_edges(self) -> np.ndarray:
        """The ``n_bins + 1`` bin edges in normalized units, float64, from -1 to +1."""
        return self._edges.copy()

    @property
    def bin_centers(self) -> np.ndarray:
        """The ``n_bins`` bin centres in normalized units, float64: ``-1 + (i + 0.5) * 2 / n_bins``."""
        return (self._edges[:-1] + self._edges[1:]) / 2.0

    # ------------------------------------------------------------------ maps
    def _normalize(self, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unclipped normalized values and the out-of-range mask for a checked (..., D) array."""
        # Constant dims: 0 at low; outside [low, high] the sign, so they clip to the end bins too.
        scaled = np.where(self.high > self.low, 2.0 * (arr - self.low) / self._span - 1.0, np.sign(arr - self.low))
        norm = np.where(self.normalize_mask, scaled, arr)
        raw_out = (arr < self.low) | (arr > self.high)
        norm_out = (arr < -1.0) | (arr > 1.0)
        return norm, np.where(self.normalize_mask, raw_out, norm_out)

    def normalize(self, actions: Any) -> np.ndarray:
        """Map actions ``(..., D)`` in action units to float64 ``(..., D)`` in [-1, 1] (clipped).

        ``2 * (x - low) / (high - low) - 1`` per dimension; a constant dimension gives 0
        at ``x == low`` (and -1 / +1 below / above it, like any out-of-range value);
        dimensions with ``normalize_mask=False`` pass through (then clipped).

        Raises:
            ValueError: wrong last dimension, or NaN/inf (message gives the first bad index).
        """
        arr, _ = as_float_array(actions, name="actions", last_dim=self.action_dim)
        return np.clip(self._normalize(arr)[0], -1.0, 1.0)

    def unnormalize(self, normalized: Any) -> np.ndarray:
        """Inverse of ``normalize``: float ``(..., D)`` normalized units -> float64 action units (not clipped)."""
        arr, _ = as_float_array(normalized, name="normalized", last_dim=self.action_dim)
        scaled = (arr + 1.0) / 2.0 * (self.high - self.low) + self.low
        return np.where(self.normalize_mask, scaled, arr)

    def encode(self, actions: Any, *, return_clipped: bool = False) -> Any:
        """Actions ``(..., D)`` float (action units) -> bins ``(..., D)`` int64 in ``[0, n_bins)``.

        Bin ``i`` covers normalized ``[-1 + i*w, -1 + (i+1)*w)``, ``w = 2 / n_bins``;
        +1 goes to bin ``n_bins - 1``. Values outside ``[low, high]`` are clipped to
        the end bins (``[-1, 1]`` for dimensions with ``normalize_mask=False``).

        Args:
            actions: numpy array-like or torch tensor ``(..., D)``.
            return_clipped: also return a bool ``(..., D)`` marking values that were
                out of range before clipping.

        Returns:
            ``bins`` (int64; a torch tensor on the input's device for torch input),
            or ``(bins, clipped)`` when ``return_clipped``.

        Raises:
            ValueError: wrong last dimension, or NaN/inf (message gives the first bad index).

        Example:
            >>> tok = BinningTokenizer([-1.0], [1.0], n_bins=4)
            >>> tok.encode([[-1.0], [-0.5], [0.49], [1.0], [7.0]]).ravel().tolist()
            [0, 1, 2, 3, 3]
        """
        arr, device = as_float_array(actions, name="actions", last_dim=self.action_dim)
        norm, clipped = self._normalize(arr)
        norm = np.clip(norm, -1.0, 1.0)
        bins = np.searchsorted(self._edges[1:-1], norm, side="right").astype(np.int64)
        out = from_numpy(bins, device)
        if return_clipped:
            return out, from_numpy(clipped, device)
        return out

    def decode(self, bins: Any) -> Any:
        """Bins ``(..., D)`` int -> actions ``(..., D)`` float64 at bin centres, in action units.

        Torch input gives a float32 tensor on the input's device.

        Raises:
            TypeError: ``bins`` is not of an integer dtype.
            ValueError: wrong last dimension, or a bin outside ``[0, n_bins)`` (never clipped).
        """
        arr, device = as_int_array(bins, name="bins", low=0, high=self.n_bins, what="bin indices")
        if arr.ndim == 0 or arr.shape[-1] != self.action_dim:
            raise ValueError(f"bins must have shape (..., {self.action_dim}); got shape {arr.shape}")
        actions = self.unnormalize(self.bin_centers[arr])
        if device is not None:
            return from_numpy(actions.astype(np.float32), device)
        return actions

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``format``, ``version``, ``n_bins``, ``low``, ``high``, ``normalize_mask``."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "n_bins": self.n_bins,
            "low": self.low.tolist(),
            "high": self.high.tolist(),
            "normalize_mask": self.normalize_mask.tolist(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "dict") -> BinningTokenizer:
        """Inverse of ``to_dict``. Raises ValueError on another format/version or a missing field."""
        check_header(d, fmt=FORMAT, version=VERSION, where=where)
        for field in ("n_bins", "low", "high", "normalize_mask"):
            if field not in d:
                raise ValueError(f"{where}: missing field {field!r}")
        mask = d["normalize_mask"]
        if not isinstance(mask, list) or not all(isinstance(m, bool) for m in mask):
            raise ValueError(f"{where}: field 'normalize_mask' must be a list of booleans; got {mask!r}")
        return cls(d["low"], d["high"], n_bins=d["n_bins"], normalize_mask=np.array(mask, dtype=bool))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as JSON to ``path`` atomically (temp file in the same folder, fsync, os.replace)."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BinningTokenizer:
        """Read a file written by ``save``.

        Raises:
            ValueError: invalid JSON, other ``format``/``version``, or bad fields; the
                message names the file, the field and the expected value.
        """
        return cls.from_dict(read_json(path), where=str(path))

    def __repr__(self) -> str:
        return (
            f"BinningTokenizer(action_dim={self.action_dim}, n_bins={self.n_bins}, "
            f"normalized_dims={int(self.normalize_mask.sum())})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BinningTokenizer):
            return NotImplemented
        return (
            self.n_bins == other.n_bins
            and np.array_equal(self.low, other.low)
            and np.array_equal(self.high, other.high)
            and np.array_equal(self.normalize_mask, other.normalize_mask)
        )

    __hash__ = None  # mutable numpy fields
