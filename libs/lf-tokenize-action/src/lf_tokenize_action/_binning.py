"""Binning action tokenizer (OpenVLA-style, Kim et al. 2024, arXiv:2406.09246, sec. 3.2).

Each action dimension is mapped linearly from ``[low, high]`` (action units:
q01/q99 by default, or min/max, or mean +- k*std) to ``[-1, 1]``, clipped, and cut
into exactly ``n_bins`` bins. Uniform bins (default) have width ``w = 2 / n_bins``:
bin ``i`` covers ``[-1 + i*w, -1 + (i+1)*w)`` and ``+1`` goes to bin ``n_bins - 1``.
Quantile bins put the edges at per-dimension quantiles of the fitting data
(``_quantile.py``). Decoding returns bin centres. OpenVLA's own code uses
``n_bins`` *edges* instead, which leaves ``n_bins - 1`` intervals plus one token
value for exactly +1; ``layout="openvla"`` reproduces that layout bit for bit
(the README compares the two).

Shapes: ``D`` = action_dim; ``...`` = any leading dims (batch, time).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._arrays import CUPY, as_float_array, as_int_array, from_numpy
from ._binning_io import BINNINGS, LAYOUTS, binning_kwargs_from_dict, binning_to_dict
from ._bounds import (
    DEFAULT_STD_K,
    bounds_from_actions,
    bounds_from_stats_or_actions,
    normalize_unclipped,
    unnormalize,
    vector,
)
from ._io import read_json, write_json_atomic
from ._quantile import check_edges, digitize, quantile_edges


class BinningTokenizer:
    """Per-dimension normalization to [-1, 1] then ``n_bins`` uniform or quantile bins.

    Args:
        low, high: float arrays ``(D,)``, normalization bounds in action units.
            ``low == high`` is allowed (a constant dimension: ``low`` normalizes to 0,
            every bin decodes to ``low``; values off it clip to the end bins).
        n_bins: number of bins per dimension, >= 2.
        normalize_mask: optional bool ``(D,)``; ``False`` marks a dimension that
            is *not* normalized: it is taken raw, assumed already in [-1, 1]
            (e.g. a gripper), and its ``low``/``high`` are ignored. Default all True.
        edges: optional float ``(D, n_bins + 1)`` bin edges in normalized units,
            strictly increasing from -1 to +1 per dimension (quantile binning, see
            ``from_actions``); ``None`` (default) means uniform bins.
        layout: ``"exact"`` (default): exactly ``n_bins`` equal bins. ``"openvla"``:
            OpenVLA's ``ActionTokenizer`` layout (uniform only): ``n_bins`` *edges*
            ``linspace(-1, 1, n_bins)``, token value ``np.digitize(x, edges) - 1``
            in ``[0, n_bins)``, where value ``n_bins - 1`` is taken only by x = +1
            and decodes like ``n_bins - 2`` (OpenVLA folds it the same way).

    Raises:
        ValueError: shapes differ or are not 1-D, ``low > high`` anywhere,
            non-finite bounds, ``n_bins < 2`` (``< 3`` for ``layout="openvla"``), bad ``edges``,
            an unknown ``layout`` or ``edges`` with ``layout="openvla"``; the message names the field and value.

    Example:
        >>> tok = BinningTokenizer([0.0, -2.0], [1.0, 2.0], n_bins=4)
        >>> tok.encode([[0.5, 2.0]]).tolist()
        [[2, 3]]
        >>> tok.decode([[2, 3]]).tolist()
        [[0.625, 1.5]]
    """

    def __init__(
        self, low: Any, high: Any, *, n_bins: int = 256, normalize_mask: Any = None, edges: Any = None,
        layout: str = "exact",
    ) -> None:
        if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 2:
            raise ValueError(f"n_bins must be an int >= 2; got {n_bins!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {list(LAYOUTS)}; got {layout!r}")
        if layout == "openvla" and (edges is not None or n_bins < 3):
            raise ValueError(f"layout='openvla' needs uniform bins (edges=None) and n_bins >= 3; got "
                             f"edges={'given' if edges is not None else None}, n_bins={n_bins}")
        self.layout: str = layout
        low_, high_ = vector(low, "low"), vector(high, "high")
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
        self._uniform_edges = np.linspace(-1.0, 1.0, self.n_bins + (layout == "exact"))
        self._edges: np.ndarray | None = (
            None if edges is None else check_edges(edges, n_bins=self.n_bins, action_dim=int(low_.shape[0]))
        )
        e = self._edges_2d()
        self._centers = (e[:, :-1] + e[:, 1:]) / 2.0  # (D, n_bins)
        if layout == "openvla":  # the value for x = +1 decodes to the last interval's centre
            self._centers = np.concatenate([self._centers, self._centers[:, -1:]], axis=1)

    # ------------------------------------------------------------------ building
    @classmethod
    def fit(
        cls,
        stats: Mapping[str, Sequence[float]] | Any,
        *,
        n_bins: int = 256,
        bounds: str = "q01_q99",
        normalize_mask: Any = None,
        std_k: float = DEFAULT_STD_K,
        binning: str = "uniform",
        actions: Any = None,
        layout: str = "exact",
    ) -> BinningTokenizer:
        """Build from a LeRobot ``meta/stats.json`` action entry (keys mean, std, min, max, q01, q99).

        ``bounds="q01_q99"`` uses ``stats["q01"]``/``stats["q99"]`` (OpenVLA's choice);
        ``"min_max"`` uses ``stats["min"]``/``stats["max"]``; ``"mean_std"`` uses
        ``mean -+ std_k * std`` (default ``std_k = 3``: the three-sigma interval, 99.7 %
        of a normal distribution, comparable to the 98 % kept by q01/q99). Other keys
        are ignored. ``stats`` may also be the raw action table, float ``(N, D)`` in
        action units (numpy, torch or nested lists): the bounds are then computed from
        it as ``from_actions`` does (numpy's linear quantiles, population std).
        ``binning="quantile"`` also needs ``actions`` ``(N, D)``, the table whose
        quantiles become the bin edges (stats hold too few quantiles); when ``stats``
        is that table, it is used. ``layout`` is passed to the constructor
        (``"openvla"``: OpenVLA's edges).

        Raises:
            TypeError: ``stats`` is neither a mapping nor a numeric array.
            ValueError: unknown ``bounds``/``binning``, a needed key missing (the message
                names it), an action table that is not ``(N, D)`` finite, or
                ``binning="quantile"`` with a stats mapping and no ``actions``.

        Example:
            >>> BinningTokenizer.fit({"q01": [-1.0], "q99": [3.0]}, n_bins=8).high.tolist()
            [3.0]
            >>> BinningTokenizer.fit({"mean": [1.0], "std": [0.5]}, bounds="mean_std").low.tolist()
            [-0.5]
        """
        _check_binning(binning)
        low, high = bounds_from_stats_or_actions(stats, bounds, std_k)
        tok = cls(low, high, n_bins=n_bins, normalize_mask=normalize_mask, layout=layout)
        if binning == "uniform":
            return tok
        if actions is None and not isinstance(stats, Mapping):
            actions = stats
        if actions is None:
            raise ValueError("binning='quantile' needs actions (N, D) to place the bin edges; got actions=None")
        return tok._with_quantile_edges(actions)

    @classmethod
    def from_actions(
        cls,
        actions: Any,
        *,
        n_bins: int = 256,
        bounds: str = "q01_q99",
        normalize_mask: Any = None,
        std_k: float = DEFAULT_STD_K,
        binning: str = "uniform",
        layout: str = "exact",
    ) -> BinningTokenizer:
        """Build from a table of actions ``(N, D)`` float: bounds and (for quantile binning) edges.

        Bounds: per-dimension 1 %/99 % quantiles (numpy's linear method), min/max, or
        mean -+ ``std_k`` * std (population std). ``binning="quantile"`` places the
        interior edges at the ``i / n_bins`` quantiles of the normalized, clipped
        actions (blended with uniform edges by ``QUANTILE_MIX = 1e-3`` so that exactly
        ``n_bins`` bins stay reachable; see ``_quantile.py``).

        Raises:
            ValueError: ``actions`` not 2-D with N >= 1, non-finite values, unknown ``bounds``/``binning``.

        Example:
            >>> x = np.array([[0.0], [0.1], [0.2], [1.0]])
            >>> tok = BinningTokenizer.from_actions(x, n_bins=2, bounds="min_max", binning="quantile")
            >>> tok.binning, tok.encode([[0.1], [0.2]]).ravel().tolist()
            ('quantile', [0, 1])
        """
        _check_binning(binning)
        arr, _ = as_float_array(actions, name="actions")
        if arr.ndim != 2 or arr.shape[0] == 0:
            raise ValueError(f"actions must have shape (N, D) with N >= 1; got shape {arr.shape}")
        low, high = bounds_from_actions(arr, bounds, std_k)
        tok = cls(low, high, n_bins=n_bins, normalize_mask=normalize_mask, layout=layout)
        return tok if binning == "uniform" else tok._with_quantile_edges(arr)

    def _with_quantile_edges(self, actions: Any) -> BinningTokenizer:
        arr, _ = as_float_array(actions, name="actions", last_dim=self.action_dim)
        if arr.ndim != 2 or arr.shape[0] == 0:
            raise ValueError(f"actions must have shape (N, {self.action_dim}) with N >= 1; got shape {arr.shape}")
        edges = quantile_edges(self.normalize(arr), self.n_bins)
        return type(self)(self.low, self.high, n_bins=self.n_bins, normalize_mask=self.normalize_mask, edges=edges,
                          layout=self.layout)

    # ------------------------------------------------------------------ layout
    @property
    def action_dim(self) -> int:
        """Number of action dimensions D."""
        return int(self.low.shape[0])

    @property
    def binning(self) -> str:
        """``"uniform"`` or ``"quantile"``."""
        return "uniform" if self._edges is None else "quantile"

    def _edges_2d(self) -> np.ndarray:
        if self._edges is not None:
            return self._edges
        return np.broadcast_to(self._uniform_edges, (self.action_dim, self._uniform_edges.size))

    @property
    def bin_width(self) -> float:
        """Uniform bin width in normalized units, ``2 / n_bins`` (``2 / (n_bins - 1)`` for ``layout="openvla"``).

        Raises:
            ValueError: quantile binning (widths differ; use ``bin_widths``).
        """
        if self._edges is not None:
            raise ValueError("bin_width is defined for binning='uniform' only; got 'quantile' (use bin_widths)")
        return 2.0 / (self._uniform_edges.size - 1)

    @property
    def bin_widths(self) -> np.ndarray:
        """Width of every bin in normalized units, float64 ``(D, n_bins)`` (``layout="openvla"``: the last is 0)."""
        widths = np.diff(self._edges_2d(), axis=1)
        if self.layout == "openvla":
            widths = np.concatenate([widths, np.zeros((self.action_dim, 1))], axis=1)
        return widths

    @property
    def bin_edges(self) -> np.ndarray:
        """Bin edges in normalized units, float64: ``(n_bins + 1,)`` when uniform, ``(D, n_bins + 1)`` when quantile.

        ``layout="openvla"``: OpenVLA's ``n_bins`` edges ``linspace(-1, 1, n_bins)``.
        """
        return (self._uniform_edges if self._edges is None else self._edges).copy()

    @property
    def bin_centers(self) -> np.ndarray:
        """Bin centres in normalized units, float64: ``(n_bins,)`` when uniform, ``(D, n_bins)`` when quantile."""
        return (self._centers[0] if self._edges is None else self._centers).copy()

    # ------------------------------------------------------------------ maps
    def _normalize(self, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return normalize_unclipped(arr, self.low, self.high, self.normalize_mask)

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
        return unnormalize(arr, self.low, self.high, self.normalize_mask)

    def encode(self, actions: Any, *, return_clipped: bool = False) -> Any:
        """Actions ``(..., D)`` float (action units) -> bins ``(..., D)`` int64 in ``[0, n_bins)``.

        Bin ``i`` of dimension ``d`` covers normalized ``[edges[d, i], edges[d, i+1])``
        (uniform: ``[-1 + i*w, -1 + (i+1)*w)``, ``w = 2 / n_bins``); +1 goes to bin
        ``n_bins - 1``. Values outside ``[low, high]`` are clipped to the end bins
        (``[-1, 1]`` for dimensions with ``normalize_mask=False``).

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
        if self.layout == "openvla":  # np.digitize(x, edges) - 1, exactly as OpenVLA
            bins = np.searchsorted(self._uniform_edges, norm, side="right").astype(np.int64) - 1
        elif self._edges is None:
            bins = np.searchsorted(self._uniform_edges[1:-1], norm, side="right").astype(np.int64)
        else:
            bins = digitize(norm, self._edges)
        out = from_numpy(bins, device)
        if return_clipped:
            return out, from_numpy(clipped, device)
        return out

    def decode(self, bins: Any) -> Any:
        """Bins ``(..., D)`` int -> actions ``(..., D)`` float64 at bin centres, in action units.

        Torch input gives a float32 tensor on the input's device; cupy input a float64 cupy array.

        Raises:
            TypeError: ``bins`` is not of an integer dtype.
            ValueError: wrong last dimension, or a bin outside ``[0, n_bins)`` (never clipped).
        """
        arr, device = as_int_array(bins, name="bins", low=0, high=self.n_bins, what="bin indices")
        if arr.ndim == 0 or arr.shape[-1] != self.action_dim:
            raise ValueError(f"bins must have shape (..., {self.action_dim}); got shape {arr.shape}")
        if self._edges is None:
            centres = self._centers[0][arr]
        else:
            centres = self._centers[np.arange(self.action_dim), arr]
        actions = unnormalize(centres, self.low, self.high, self.normalize_mask)
        if device is not None and device != CUPY:
            return from_numpy(actions.astype(np.float32), device)
        return from_numpy(actions, device)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``format``, ``version``, ``n_bins``, ``low``, ``high``, ``normalize_mask``.

        Uniform bins write version 1 (the 0.1.0 layout, unchanged). Quantile bins write
        version 2 with two more fields: ``binning: "quantile"`` and ``edges``, a list of
        D lists of ``n_bins + 1`` floats in normalized units (JSON floats round-trip exactly),
        so a 0.1.0 reader refuses the file instead of silently using uniform bins.
        """
        return binning_to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "dict") -> BinningTokenizer:
        """Inverse of ``to_dict``; reads versions 1, 2 and 3.

        Raises:
            ValueError: another format or version, a missing field, or bad values (named).
        """
        return cls(**binning_kwargs_from_dict(d, where=where))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as JSON to ``path`` atomically (temp file in the same folder, fsync, os.replace)."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BinningTokenizer:
        """Read a file written by ``save`` (version 1, 2 or 3).

        Raises:
            ValueError: invalid JSON, other ``format``/``version``, or bad fields; the
                message names the file, the field and the expected value.
        """
        return cls.from_dict(read_json(path), where=str(path))

    def __repr__(self) -> str:
        return (
            f"BinningTokenizer(action_dim={self.action_dim}, n_bins={self.n_bins}, binning={self.binning!r}, "
            f"layout={self.layout!r}, "
            f"normalized_dims={int(self.normalize_mask.sum())})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BinningTokenizer):
            return NotImplemented
        return (
            self.n_bins == other.n_bins
            and self.layout == other.layout
            and np.array_equal(self.low, other.low)
            and np.array_equal(self.high, other.high)
            and np.array_equal(self.normalize_mask, other.normalize_mask)
            and self.binning == other.binning
            and (self._edges is None or np.array_equal(self._edges, other._edges))
        )

    __hash__ = None  # mutable numpy fields


def _check_binning(binning: str) -> None:
    if binning not in BINNINGS:
        raise ValueError(f"binning must be one of {list(BINNINGS)}; got {binning!r}")
