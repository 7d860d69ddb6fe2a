"""Reconstruction error of a fitted ``FastTokenizer`` on the chunks it was fitted on, per action dimension.

``FastTokenizer.fit`` measures ``decode(encode(x)) - x`` for every fitting chunk
``x`` ``(n, H, D)`` in action units and keeps, per dimension ``d``, the largest
absolute error and the root mean square error over the ``n * H`` values. The
error has two sources: rounding the scaled DCT coefficients (at most ``0.5 /
scale`` per coefficient in normalized units; the orthonormal DCT keeps the L2
norm) and clipping actions to the normalization bounds (q01/q99 by default
clips about 2 % of the values).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import ReconstructionToleranceError


@dataclass(frozen=True, eq=False)
class ReconstructionStats:
    """Per-dimension reconstruction error of FAST on its fitting data (``FastTokenizer.reconstruction_error``).

    Attributes:
        max_abs: float64 ``(D,)``, ``max |decode(encode(x)) - x|`` over chunks and time, action units.
        rms: float64 ``(D,)``, ``sqrt(mean((decode(encode(x)) - x) ** 2))`` over chunks and time, action units.
        chunks: number of chunks ``n`` it was measured on.
    """

    max_abs: np.ndarray
    rms: np.ndarray
    chunks: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"max_abs": [D floats], "rms": [D floats], "chunks": n}``."""
        return {"max_abs": self.max_abs.tolist(), "rms": self.rms.tolist(), "chunks": int(self.chunks)}

    @classmethod
    def from_dict(cls, d: Any, *, where: str, action_dim: int) -> ReconstructionStats:
        """Inverse of ``to_dict``; ValueError naming ``where`` and the field on a bad value."""
        field = "reconstruction_error"
        if not isinstance(d, Mapping) or not {"max_abs", "rms", "chunks"} <= set(d):
            raise ValueError(f"{where}: field {field!r} must be an object with keys max_abs, rms, chunks; got {d!r}")
        chunks = d["chunks"]
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"{where}: field '{field}.chunks' must be an int >= 1; got {chunks!r}")
        arrays = {}
        for key in ("max_abs", "rms"):
            try:
                arr = np.asarray(d[key], dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{where}: field '{field}.{key}' must be a list of floats; got {d[key]!r}") from err
            if arr.shape != (action_dim,) or not np.isfinite(arr).all() or (arr < 0).any():
                raise ValueError(
                    f"{where}: field '{field}.{key}' must be {action_dim} finite floats >= 0; got {d[key]!r}"
                )
            arrays[key] = arr
        return cls(max_abs=arrays["max_abs"], rms=arrays["rms"], chunks=chunks)


def measure(reconstructed: np.ndarray, chunks: np.ndarray) -> ReconstructionStats:
    """Stats of ``reconstructed - chunks``, both float64 ``(n, H, D)`` in action units."""
    err = reconstructed - chunks
    max_abs = np.abs(err).max(axis=(0, 1))
    rms = np.sqrt(np.mean(err**2, axis=(0, 1)))
    return ReconstructionStats(max_abs=max_abs, rms=rms, chunks=int(chunks.shape[0]))


def tolerance_vector(limit: float | Sequence[float], action_dim: int) -> np.ndarray:
    """``max_reconstruction_error`` as float64 ``(D,)``: a number for every dimension, or one per dimension.

    Raises:
        ValueError: not a finite number >= 0 (or ``D`` of them).
    """
    try:
        arr = np.broadcast_to(np.asarray(limit, dtype=np.float64), (action_dim,))
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"max_reconstruction_error must be a number or {action_dim} numbers (one per action dimension, "
            f"action units); got {limit!r}"
        ) from err
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError(f"max_reconstruction_error must be finite and >= 0; got {limit!r}")
    return arr


def check_tolerance(stats: ReconstructionStats, limit: np.ndarray, bound_clip: np.ndarray, scale: float) -> None:
    """Raise ``ReconstructionToleranceError`` for the first dimension whose ``max_abs`` exceeds ``limit``.

    ``bound_clip`` float64 ``(D,)``: the max absolute error of clipping to the bounds alone (named in the hint).
    """
    over = np.flatnonzero(stats.max_abs > limit)
    if over.size:
        d = int(over[0])
        raise ReconstructionToleranceError(dim=d, max_abs=float(stats.max_abs[d]), limit=float(limit[d]),
                                           bound_clip=float(bound_clip[d]), scale=scale)
