"""Array plumbing shared by the tokenizers: torch <-> numpy, finiteness and integer checks.

torch and cupy are optional. Neither is imported here: a value is a torch tensor
(cupy array) only if ``torch`` (``cupy``) is already in ``sys.modules`` (the caller
built the value, so it is) and the value is an instance of ``torch.Tensor``
(``cupy.ndarray``). Results go back to the caller's kind of array: a torch tensor
on the input's device, or a cupy array on the current cupy device.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def is_torch_tensor(x: Any) -> bool:
    """True when ``x`` is a ``torch.Tensor`` (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


CUPY = "cupy"
"""The ``device`` marker :func:`to_numpy` returns for a cupy input."""


def is_cupy(x: Any) -> bool:
    """True when ``x`` is a ``cupy.ndarray`` (without importing cupy)."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def to_numpy(x: Any, *, name: str) -> tuple[np.ndarray, Any]:
    """Convert ``x`` to a numpy array; return ``(array, device)``.

    ``device`` is the torch device when ``x`` was a torch tensor, :data:`CUPY` for a
    cupy array (copied to the host), else ``None``. Floating torch tensors (bf16 and
    half included) are widened to float64.
    """
    if is_cupy(x):
        return x.get(), CUPY
    if is_torch_tensor(x):
        t = x.detach().cpu()
        if t.is_floating_point():
            t = t.double()
        return t.numpy(), x.device
    try:
        return np.asarray(x), None
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be array-like; got {type(x).__name__}: {err}") from err


def from_numpy(arr: np.ndarray, device: Any) -> Any:
    """``arr`` unchanged when ``device`` is None, a cupy array for :data:`CUPY`, else a torch tensor on ``device``."""
    if device is None:
        return arr
    if device == CUPY:
        return sys.modules["cupy"].asarray(arr)
    torch = sys.modules["torch"]
    return torch.from_numpy(np.ascontiguousarray(arr)).to(device)


def first_index(mask: np.ndarray) -> tuple[int, ...]:
    """Index (as a tuple of ints) of the first True element of ``mask`` in C order."""
    if mask.ndim == 0:
        return ()
    flat = int(np.flatnonzero(mask.ravel())[0])
    return tuple(int(i) for i in np.unravel_index(flat, mask.shape))


def check_finite(arr: np.ndarray, *, name: str) -> None:
    """Raise ValueError naming the first NaN/inf element of ``arr``."""
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = first_index(bad)
        raise ValueError(
            f"{name} must be finite; got {float(arr[idx])} at index {idx} "
            f"({int(bad.sum())} non-finite value(s) in total)"
        )


def as_float_array(x: Any, *, name: str, last_dim: int | None = None) -> tuple[np.ndarray, Any]:
    """Convert to a finite float64 array of shape (..., last_dim); return ``(array, device)``."""
    arr, device = to_numpy(x, name=name)
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.number)):
        raise TypeError(f"{name} must be a real numeric array; got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must be real; got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if last_dim is not None and (arr.ndim == 0 or arr.shape[-1] != last_dim):
        raise ValueError(f"{name} must have shape (..., {last_dim}); got shape {arr.shape}")
    check_finite(arr, name=name)
    return arr, device


def as_int_array(x: Any, *, name: str, low: int, high: int, what: str) -> tuple[np.ndarray, Any]:
    """Convert to an int64 array whose values all lie in [low, high); return ``(array, device)``.

    Raises:
        TypeError: ``x`` is not of an integer dtype.
        ValueError: some value lies outside ``[low, high)``; the message says how
            many and gives the first offending value and its index.
    """
    arr, device = to_numpy(x, name=name)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype; got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    bad = (arr < low) | (arr >= high)
    if bad.any():
        idx = first_index(bad)
        raise ValueError(
            f"{name} must be {what} in [{low}, {high}); {int(bad.sum())} value(s) out of range, "
            f"first is {int(arr[idx])} at index {idx}"
        )
    return arr, device
