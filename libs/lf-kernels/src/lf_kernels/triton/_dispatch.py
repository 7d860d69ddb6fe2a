"""Which implementation a fused op runs: the Triton kernel or the PyTorch reference.

Triton runs when it is importable and either every tensor is on a CUDA device,
or every tensor is on the CPU and ``TRITON_INTERPRET=1`` (Triton's interpreter,
used by the CPU test suite). Anything else (CPU without the interpreter, MPS,
mixed devices, no Triton) takes the plain-PyTorch reference, so models keep
working everywhere.

The kernel modules are imported lazily, on the first call that takes Triton:
``triton.jit`` fixes interpreted-vs-compiled when a kernel is defined. In
practice ``TRITON_INTERPRET`` must be set before ``triton`` itself is first
imported, and PyTorch imports it early (building a model reaches
``torch._dynamo``, which imports triton): set it in the environment of the
process, as the CPU tests do. Set later, this module still reports
``"triton"`` for CPU tensors, but the kernels fail with Triton's
``InterpreterError`` ("Cannot call @triton.jit'd outside of the scope of a
kernel"). If the kernels were already defined in compiled mode, CPU tensors
take the reference even when the variable is set later.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Literal

import torch

__all__ = ["FusedBackend", "kernel_backend", "resolve_backend"]

FusedBackend = Literal["triton", "reference"]

_KERNELS_PKG = "lf_kernels.triton._kernels"


@functools.cache
def _triton_importable() -> bool:
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def _interpreter_on() -> bool:
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("1", "true", "on", "yes"):
        return False
    kernels = sys.modules.get(_KERNELS_PKG)
    return kernels is None or bool(kernels.INTERPRETED)


def kernel_backend(*tensors: torch.Tensor | None) -> FusedBackend:
    """The backend the fused ops take for these tensors (``None`` entries are ignored).

    Returns:
        ``"triton"`` if Triton is importable and all tensors are on CUDA, or all
        on the CPU with ``TRITON_INTERPRET=1``; ``"reference"`` otherwise.

    Example:
        >>> kernel_backend(torch.zeros(2), None) in ("triton", "reference")
        True
    """
    devices = {t.device.type for t in tensors if t is not None}
    if len(devices) != 1 or not _triton_importable():
        return "reference"
    (device,) = devices
    if device == "cuda" or (device == "cpu" and _interpreter_on()):
        return "triton"
    return "reference"


def resolve_backend(op: str, backend: FusedBackend | None, *tensors: torch.Tensor | None) -> FusedBackend:
    """``backend`` if given (after checking it can run), else :func:`kernel_backend`.

    Raises:
        ValueError: ``backend`` is not ``"triton"``, ``"reference"`` or ``None``.
        RuntimeError: ``backend="triton"`` for tensors Triton cannot run on here.
    """
    if backend is None:
        return kernel_backend(*tensors)
    if backend not in ("triton", "reference"):
        raise ValueError(f"{op}: backend must be 'triton', 'reference' or None, got {backend!r}")
    if backend == "triton" and kernel_backend(*tensors) != "triton":
        devices = sorted({str(t.device) for t in tensors if t is not None})
        raise RuntimeError(
            f"{op}: backend='triton' needs triton installed and CUDA tensors (or CPU tensors with "
            f"TRITON_INTERPRET=1 set before the first kernel call); got devices {devices}, "
            f"triton importable={_triton_importable()}"
        )
    return backend


def kernels(name: str | None = None):
    """The lazily imported kernel package ``lf_kernels.triton._kernels``, or its module ``name``."""
    return importlib.import_module(_KERNELS_PKG if name is None else f"{_KERNELS_PKG}.{name}")
