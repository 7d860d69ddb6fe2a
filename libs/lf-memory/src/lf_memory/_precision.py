"""Mixed-precision policy: master weights in float32, compute in bf16, fp16 or fp32.

Mixed precision after Micikevicius et al. 2018 ("Mixed Precision Training",
arXiv 1710.03740): float32 master weights and optimizer state, autocast
compute. bf16 has fp32's exponent range and needs no loss scaling; fp16 does
(:attr:`PrecisionPolicy.needs_loss_scaling`, served by
:class:`lf_memory.DynamicLossScaler`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

__all__ = ["PRECISION_CHOICES", "PrecisionPolicy", "resolve_precision"]

PRECISION_CHOICES: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")
_COMPUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class PrecisionPolicy:
    """Which dtypes weights are kept in and matrix products are computed in.

    Raises:
        ValueError: ``param_dtype`` is not float32, or ``compute_dtype`` is
            not bfloat16, float16 or float32.

    Example:
        >>> policy = PrecisionPolicy(torch.float32, torch.bfloat16)
        >>> with policy.autocast("cpu"):
        ...     y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
        >>> y.dtype
        torch.bfloat16
    """

    param_dtype: torch.dtype
    """Master weights and optimizer state; always ``torch.float32`` in this version."""
    compute_dtype: torch.dtype
    """Dtype of autocast-eligible ops (matmul, conv): ``torch.bfloat16``, ``torch.float16`` or ``torch.float32``."""

    def __post_init__(self) -> None:
        if self.param_dtype != torch.float32:
            raise ValueError(
                f"PrecisionPolicy.param_dtype must be torch.float32, got {self.param_dtype}"
            )
        if self.compute_dtype not in _COMPUTE_DTYPES:
            raise ValueError(
                "PrecisionPolicy.compute_dtype must be torch.bfloat16, torch.float16 or torch.float32, "
                f"got {self.compute_dtype}"
            )

    @property
    def needs_loss_scaling(self) -> bool:
        """True for fp16 compute: gradients need dynamic loss scaling (``DynamicLossScaler``)."""
        return self.compute_dtype == torch.float16

    def autocast(self, device_type: str | torch.device) -> contextlib.AbstractContextManager:
        """Context for the forward pass (and loss) on ``device_type``.

        Returns ``torch.autocast(device_type, dtype=compute_dtype)`` when
        ``compute_dtype`` is not float32, else a ``contextlib.nullcontext()``.
        ``device_type`` is ``"cuda"`` / ``"cpu"`` (a ``torch.device`` is accepted).
        """
        if isinstance(device_type, torch.device):
            device_type = device_type.type
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.compute_dtype)


def _cuda_bf16_support(device: torch.device) -> tuple[bool, bool]:
    """``(native, with_emulation)`` bf16 support of a CUDA device; both False without CUDA."""
    if not torch.cuda.is_available():
        return False, False
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        return (
            torch.cuda.is_bf16_supported(including_emulation=False),
            torch.cuda.is_bf16_supported(including_emulation=True),
        )


def resolve_precision(requested: str, device: torch.device | str) -> PrecisionPolicy:
    """Turn the config's ``precision`` string into a :class:`PrecisionPolicy`.

    - ``"fp32"``: float32 everywhere.
    - ``"fp16"``: fp16 autocast over float32 weights, with dynamic loss scaling
      (``needs_loss_scaling``). Allowed on every CUDA device and on CPU (PyTorch's
      CPU autocast supports float16; slow there, meant for tests).
    - ``"bf16"``: bf16 autocast over float32 weights. Allowed on CPU (PyTorch's
      CPU autocast supports bf16) and on any CUDA device where
      ``torch.cuda.is_bf16_supported()`` holds (emulated bf16 on pre-Ampere
      GPUs counts: it is correct, only slow). Only CUDA devices are checked.
    - ``"auto"``: bf16 on a CUDA device with *native* bf16 (Ampere, Hopper and
      later), fp32 otherwise, CPU included: CPU bf16 autocast is slower than
      fp32 on most CPUs (only those with AMX / AVX512-BF16 gain), so ``auto``
      never picks it there; ask for ``"bf16"`` explicitly to get it.

    Args:
        requested: one of ``"auto"``, ``"bf16"``, ``"fp16"``, ``"fp32"``.
        device: the device training runs on (``torch.device`` or a string).

    Returns:
        The policy; ``param_dtype`` is always ``torch.float32``.

    Raises:
        ValueError: ``requested`` is not a valid choice (lists them); ``"bf16"``
            on a CUDA device without bf16 support (names the device).

    Example:
        >>> resolve_precision("auto", torch.device("cpu")).compute_dtype
        torch.float32
        >>> resolve_precision("bf16", "cpu").compute_dtype
        torch.bfloat16
    """
    if requested not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {list(PRECISION_CHOICES)}, got {requested!r}")
    device = torch.device(device)
    if requested == "fp32":
        return PrecisionPolicy(torch.float32, torch.float32)
    if requested == "fp16":
        return PrecisionPolicy(torch.float32, torch.float16)
    if requested == "bf16":
        if device.type == "cuda" and not _cuda_bf16_support(device)[1]:
            raise ValueError(
                f"precision 'bf16' was requested but device {device} does not support bfloat16; "
                "use 'fp32' or 'auto'"
            )
        return PrecisionPolicy(torch.float32, torch.bfloat16)
    if device.type == "cuda" and _cuda_bf16_support(device)[0]:
        return PrecisionPolicy(torch.float32, torch.bfloat16)
    return PrecisionPolicy(torch.float32, torch.float32)
