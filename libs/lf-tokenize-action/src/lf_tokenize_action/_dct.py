"""Orthonormal DCT-II along the time axis of action chunks, on numpy (scipy) or cupy (cupyx).

Shapes: ``(n, H, D)`` = (chunks, horizon, action_dim); the transform runs along
``H`` (axis -2) for every dimension separately, as in FAST (Pertsch et al. 2025,
arXiv:2501.09747, sec. 4). ``norm="ortho"`` makes it an orthonormal map, so the
L2 error of the rounded coefficients equals the L2 error of the reconstruction.

cupy is optional and never imported here: an array is a cupy array only if
``cupy`` is already in ``sys.modules`` and the value is a ``cupy.ndarray``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import scipy.fft

from ._arrays import is_cupy as is_cupy_array


def array_module(x: Any) -> Any:
    """``cupy`` for a cupy array, else ``numpy``."""
    return sys.modules["cupy"] if is_cupy_array(x) else np


def dct_time(x_nhd: Any) -> Any:
    """DCT-II (orthonormal) of ``(..., H, D)`` along H; same array type, float64 for float64 input."""
    if is_cupy_array(x_nhd):
        import cupyx.scipy.fft as cufft  # optional, GPU batches only

        return cufft.dct(x_nhd, type=2, axis=-2, norm="ortho")
    return scipy.fft.dct(x_nhd, type=2, axis=-2, norm="ortho")


def idct_time(c_nhd: np.ndarray) -> np.ndarray:
    """Inverse of ``dct_time`` (DCT-III, orthonormal) along H, on numpy."""
    return scipy.fft.idct(c_nhd, type=2, axis=-2, norm="ortho")
