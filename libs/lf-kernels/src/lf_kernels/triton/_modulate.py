"""Fused adaLN modulation ``x * (1 + scale) + shift``, per sample, per frame or per token, forward and backward.

Legend: ``b`` batch, ``g`` modulation groups per sample, ``t`` tokens, ``d`` hidden.
"""

from __future__ import annotations

import torch

from .._fused_reference import modulate_reference, modulation_groups
from ._dispatch import FusedBackend, kernels, resolve_backend
from ._layout import next_pow2, unit_last

__all__ = ["modulate"]

_BLOCK_T = 16


def _as_bgd(t: torch.Tensor) -> torch.Tensor:
    """``(b|1, d)`` or ``(b|1, g, d)`` -> ``(b|1, g, d)`` view with a unit feature stride."""
    t = unit_last(t)
    return t[:, None] if t.dim() == 2 else t


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _blocks(hidden: int) -> tuple[int, int]:
    block_d = min(256, next_pow2(hidden))
    return block_d, _cdiv(hidden, block_d)


class _ModulateFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_btd, shift, scale):
        batch, tokens, hidden = x_btd.shape
        shift_bgd, scale_bgd = _as_bgd(shift), _as_bgd(scale)
        groups = shift_bgd.shape[1]
        tpg = tokens // groups
        x_btd = x_btd.contiguous()
        y_btd = torch.empty_like(x_btd)
        block_d, d_blocks = _blocks(hidden)
        t_blocks = _cdiv(tpg, _BLOCK_T)
        if x_btd.numel():
            kernels("modulate").modulate_fwd[(batch * groups * t_blocks, d_blocks)](
                x_btd, shift_bgd, scale_bgd, y_btd, groups, tpg, hidden, t_blocks,
                shift_bgd.stride(0) if shift_bgd.shape[0] > 1 else 0, shift_bgd.stride(1),
                scale_bgd.stride(0) if scale_bgd.shape[0] > 1 else 0, scale_bgd.stride(1),
                BLOCK_T=_BLOCK_T, BLOCK_D=block_d, num_warps=4,
            )
        ctx.save_for_backward(x_btd, scale_bgd)
        ctx.shift_meta = (shift.shape, shift.dtype, scale.shape, scale.dtype)
        return y_btd

    @staticmethod
    def backward(ctx, dy_btd):
        k = kernels()
        x_btd, scale_bgd = ctx.saved_tensors
        shift_shape, shift_dtype, scale_shape, scale_dtype = ctx.shift_meta
        batch, tokens, hidden = x_btd.shape
        groups = scale_bgd.shape[1]
        tpg = tokens // groups
        dy_btd = dy_btd.contiguous()
        dx_btd = torch.empty_like(x_btd)
        block_d, d_blocks = _blocks(hidden)
        # Enough programs to fill the GPU (8 per SM) even when one group spans all tokens.
        wanted = _cdiv(8 * k.num_programs_hint(x_btd.device), batch * groups * d_blocks)
        n_splits = max(1, min(_cdiv(tpg, _BLOCK_T), wanted))
        tokens_per_split = _cdiv(_cdiv(tpg, n_splits), _BLOCK_T) * _BLOCK_T
        n_splits = max(1, _cdiv(tpg, tokens_per_split))
        parts = torch.zeros((2, batch * groups, n_splits, hidden), dtype=torch.float32, device=x_btd.device)
        if x_btd.numel():
            kernels("modulate").modulate_bwd[(batch * groups * n_splits, d_blocks)](
                dy_btd, x_btd, scale_bgd, dx_btd, parts[0], parts[1], groups, tpg, hidden, n_splits,
                tokens_per_split, scale_bgd.stride(0) if scale_bgd.shape[0] > 1 else 0, scale_bgd.stride(1),
                BLOCK_T=_BLOCK_T, BLOCK_D=block_d, num_warps=4,
            )
        sums_2bgd = parts.sum(2).view(2, batch, groups, hidden)
        if shift_shape[0] == 1 and batch > 1:
            sums_2bgd = sums_2bgd.sum(1, keepdim=True)
        dshift = sums_2bgd[0].reshape(shift_shape).to(shift_dtype)
        dscale = sums_2bgd[1].reshape(scale_shape).to(scale_dtype)
        return dx_btd, dshift, dscale


def modulate(
    x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, *, backend: FusedBackend | None = None
) -> torch.Tensor:
    """adaLN modulation ``x * (1 + scale) + shift`` (DiT, Peebles & Xie 2023, arXiv 2212.09748), fused.

    ``shift`` / ``scale`` hold one row per sample, or per group of consecutive
    tokens (per frame for frame-major video tokens, per token when
    ``groups == tokens``, as Wan 2.2's per-token timesteps), broadcast over the
    group's tokens. Float32 math; backward reduces ``dshift`` / ``dscale`` over
    tokens in float32.

    Args:
        x: ``(batch, tokens, hidden)``.
        shift, scale: same shape, ``(batch | 1, hidden)``, ``(batch | 1, 1, hidden)`` or
            ``(batch | 1, groups, hidden)`` with ``tokens % groups == 0``; may be strided views
            (e.g. chunks of one adaLN projection) with a unit feature stride.
        backend: ``"triton"`` / ``"reference"`` to force one; default picks (see ``kernel_backend``).

    Returns:
        ``(batch, tokens, hidden)`` in ``x.dtype``.

    Raises:
        ValueError: shapes as listed in :func:`lf_kernels._fused_reference.modulation_groups`.

    Example:
        >>> x = torch.randn(2, 6, 4)
        >>> per_frame = torch.zeros(2, 3, 4)  # 3 frames of 2 tokens
        >>> torch.equal(modulate(x, per_frame, per_frame), x)
        True
    """
    modulation_groups(x, shift, scale)
    if resolve_backend("modulate", backend, x, shift, scale) == "reference":
        return modulate_reference(x, shift, scale)
    return _ModulateFn.apply(x, shift, scale)
