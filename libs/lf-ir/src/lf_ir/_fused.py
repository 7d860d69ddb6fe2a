"""Opt-in use of lf-kernels' fused ops (RMSNorm, SwiGLU, RoPE, adaLN modulate) by the lowered modules.

Off by default: every lowered module computes in plain PyTorch until
:func:`use_fused_ops` flips its ``fused`` flag. The flag is a plain attribute,
not a parameter or buffer, so weights, parameter names and ``state_dict`` are
the same with it on or off, and checkpoints load either way.

With the flag on, a module calls the :mod:`lf_kernels` op (Triton on CUDA, or on
the CPU under ``TRITON_INTERPRET=1``; the op's own PyTorch reference elsewhere,
see :func:`lf_kernels.kernel_backend`) whenever :func:`fusable` accepts its
inputs, and its plain code otherwise: DTensor inputs (tensor / sequence
parallel), a norm without a 1-D affine weight, and so on never reach the kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lf_kernels import rms_norm

try:  # torch builds without distributed have no DTensor
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    DTensor = ()  # type: ignore[assignment,misc]

__all__ = ["RMSNormModule", "fusable", "fused_modules", "modulate_fits", "rotary_fits", "use_fused_ops"]


def fusable(*tensors: torch.Tensor | None) -> bool:
    """True if a fused op may take these tensors (``None`` ignored): none is a DTensor.

    The fused ops run on plain tensors only; a DTensor (tensor-parallel shards)
    keeps the plain PyTorch code, whose ops DTensor knows how to distribute.
    """
    return not any(isinstance(t, DTensor) for t in tensors if t is not None)


def rotary_fits(x_bhsd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """True if :func:`lf_kernels.apply_rotary` takes ``x_bhsd`` (batch, heads, seq, head_dim) with these tables.

    Tables must be plain tensors of one shape, ``(seq, rot)`` or ``(batch | 1, seq, rot)``
    with ``rot`` even and at most ``head_dim``; otherwise the caller keeps its plain rotation.
    """
    if not fusable(x_bhsd, cos, sin) or x_bhsd.dim() != 4 or cos.shape != sin.shape:
        return False
    batch, _, seq, head_dim = x_bhsd.shape
    rot = cos.shape[-1]
    lead_ok = (cos.dim() == 2 and cos.shape[0] == seq) or (
        cos.dim() == 3 and cos.shape[0] in (1, batch) and cos.shape[1] == seq)
    return lead_ok and rot > 0 and rot % 2 == 0 and rot <= head_dim


def modulate_fits(x_btd: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> bool:
    """True if :func:`lf_kernels.modulate` takes ``x_btd`` (batch, tokens, hidden) with this shift and scale.

    ``shift`` / ``scale``: plain tensors of one shape ``(batch | 1, groups, hidden)`` with ``tokens % groups == 0``.
    """
    if not fusable(x_btd, shift, scale) or x_btd.dim() != 3 or shift.shape != scale.shape or shift.dim() != 3:
        return False
    batch, tokens, hidden = x_btd.shape
    groups = shift.shape[1]
    return shift.shape[0] in (1, batch) and shift.shape[2] == hidden and groups > 0 and tokens % groups == 0


class RMSNormModule(nn.RMSNorm):
    """:class:`torch.nn.RMSNorm` (Zhang & Sennrich 2019, arXiv 1910.07467) that can call :func:`lf_kernels.rms_norm`.

    Same parameters (``weight`` of shape ``(dim,)``) and state_dict keys as
    ``nn.RMSNorm``. With ``fused`` set (see :func:`use_fused_ops`), a 1-D
    affine norm on plain tensors runs the fused op (statistics in float32,
    output in ``x.dtype``); anything else runs ``torch.nn.functional.rms_norm``.
    A bfloat16 / float16 input with a float32 weight (autocast over float32
    master weights) uses the weight cast to the input's dtype, so the output
    stays in ``x.dtype`` (not promoted to float32) and CUDA runs torch's fused
    kernel, as under FSDP2's bfloat16 ``param_dtype``.

    forward: ``x`` ``(..., dim)`` float -> same shape and dtype.
    """

    fused: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight is not None and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == torch.float32:
            # Under autocast (float32 master weights, bf16 activations) a float32 weight promotes the output to
            # float32 and sends torch.rms_norm down its unfused composite path; cast it as FSDP2's param_dtype
            # does (the gradient still reaches the float32 parameter).
            weight = weight.to(x.dtype)
        if not (self.fused and weight is not None and len(self.normalized_shape) == 1 and fusable(x, weight)):
            return F.rms_norm(x, self.normalized_shape, weight, self.eps)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps  # nn.RMSNorm's default
        return rms_norm(x, weight, eps)


def fused_modules(model: nn.Module) -> list[nn.Module]:
    """The submodules of ``model`` (itself included) that have a fused path: class attribute ``fused``, less the
    modules whose options no fused op covers (instance attribute ``has_fused_op`` False, e.g. a GeGLU MLP)."""
    return [m for m in model.modules()
            if isinstance(getattr(type(m), "fused", None), bool) and getattr(m, "has_fused_op", True)]


def use_fused_ops(model: nn.Module, enabled: bool = True) -> int:
    """Switch the lowered modules of ``model`` to lf-kernels' fused ops (``enabled=False``: back to plain PyTorch).

    Covered: RMSNorm (:class:`RMSNormModule`; not the zero-centered ``1 + weight`` norm), SwiGLU in ``MLPModule``
    (a GeGLU ``MLPModule`` is skipped and keeps its plain path), 1D RoPE
    in ``AttentionModule``, M-RoPE in the Qwen2-VL ``MMAttentionModule``, and in
    the Wan DiT the adaLN modulation of ``DiTBlockModule`` / ``AdaLNHeadModule``
    and the 3D RoPE of ``DiTAttentionModule``. The RoPE paths feed the kernel
    the module's own cos/sin tables, so the angles are those of the plain path.
    Parameters, their names and the ``state_dict`` do not change.

    Args:
        model: any ``nn.Module`` (a lowered model, or one containing lowered modules).
        enabled: the value of each module's ``fused`` flag.

    Returns:
        The number of modules whose flag was set (fusable modules found).

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``enabled`` is not a bool.

    Example:
        >>> with torch.device("meta"):
        ...     norm = RMSNormModule(8)
        >>> use_fused_ops(norm), norm.fused
        (1, True)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"use_fused_ops: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(enabled, bool):
        raise TypeError(f"use_fused_ops: enabled must be a bool, got {type(enabled).__name__}")
    modules = fused_modules(model)
    for module in modules:
        module.fused = enabled
    return len(modules)
