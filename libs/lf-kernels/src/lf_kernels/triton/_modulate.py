"""Fused adaLN modulation ``x * (1 + scale) + shift``, per sample, per frame or per token, forward and backward.

Legend: ``b`` batch, ``g`` modulation groups per sample, ``t`` tokens, ``d`` hidden.
"""

from __future__ import annotations

import torch

from .._fused_reference import modulate_reference, modulation_groups
from ._dispatch import FusedBackend, kernels, resolve_backend
from ._layout import cdiv, grid_axis, next_pow2, unit_last
from ._partials import sum_partials

__all__ = ["modulate"]

_MAX_BLOCK_D = 1024
_FEW_TOKENS = 8  # groups with fewer tokens (per-token modulation) take one-row tiles


def _as_bgd(t: torch.Tensor) -> torch.Tensor:
    """``(b|1, d)`` or ``(b|1, g, d)`` -> ``(b|1, g, d)`` view with a unit feature stride."""
    t = unit_last(t)
    return t[:, None] if t.dim() == 2 else t


def _block_d(hidden: int) -> int:
    """Feature block: the largest power of two <= 1024 dividing ``hidden`` (4096 -> 1024, 1536 -> 512: no masked
    lanes, and several programs per row for the backward's partial sums), else ``next_pow2`` capped at 1024."""
    div = hidden & -hidden
    return min(_MAX_BLOCK_D, div) if div >= 128 else min(_MAX_BLOCK_D, next_pow2(hidden))



def _batch_stride(t_bgd: torch.Tensor) -> int:
    return t_bgd.stride(0) if t_bgd.shape[0] > 1 else 0


class _ModulateFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_btd, shift, scale):
        batch, tokens, hidden = x_btd.shape
        shift_bgd, scale_bgd = _as_bgd(shift), _as_bgd(scale)
        groups = shift_bgd.shape[1]
        tpg = tokens // groups
        x_btd = x_btd.contiguous()
        y_btd = torch.empty_like(x_btd)
        block_d = _block_d(hidden)
        d_blocks = cdiv(hidden, block_d)
        bg = batch * groups
        if x_btd.numel() and groups == 1:  # one row per sample: inductor's 1-D layout
            per_sample = tokens * hidden
            bg_axis = grid_axis(batch, cdiv(per_sample, 128))  # 128: the smallest BLOCK

            def grid(meta):
                blocks = cdiv(per_sample, meta["BLOCK"])
                return (blocks, batch) if bg_axis == 1 else (batch, blocks)

            kernels("modulate").modulate_fwd_flat()[grid](
                x_btd, shift_bgd, scale_bgd, y_btd, per_sample, _batch_stride(shift_bgd), _batch_stride(scale_bgd),
                HIDDEN=hidden, BG_AXIS=bg_axis, WIDE=per_sample >= 2**31,
            )
        elif x_btd.numel():
            bg_axis = grid_axis(bg, tpg * d_blocks)  # at one token a block

            def grid(meta):
                tiles = cdiv(tpg, meta["BLOCK_R"]) * d_blocks
                return (tiles, bg) if bg_axis == 1 else (bg, tiles)

            kernels("modulate").modulate_fwd(block_d, tpg < _FEW_TOKENS)[grid](
                x_btd, shift_bgd, scale_bgd, y_btd, groups, tpg, hidden,
                _batch_stride(shift_bgd), shift_bgd.stride(1), _batch_stride(scale_bgd), scale_bgd.stride(1),
                BLOCK_D=block_d, D_BLOCKS=d_blocks, BG_AXIS=bg_axis,
            )
        ctx.save_for_backward(x_btd, scale_bgd)
        ctx.shift_meta = (shift.shape, shift.dtype, scale.shape, scale.dtype)
        return y_btd

    @staticmethod
    def backward(ctx, dy_btd):
        tuning = kernels("tuning")
        x_btd, scale_bgd = ctx.saved_tensors
        shift_shape, shift_dtype, scale_shape, scale_dtype = ctx.shift_meta
        batch, tokens, hidden = x_btd.shape
        groups = scale_bgd.shape[1]
        tpg = tokens // groups
        bg = batch * groups
        dy_btd = dy_btd.contiguous()
        dx_btd = torch.empty_like(x_btd)
        block_d = _block_d(hidden)
        d_blocks = cdiv(hidden, block_d)
        # A persistent-size grid: ~k programs per SM over (group, token split, feature block), whatever the grouping.
        programs = tuning.sm_count(x_btd.device) * tuning.programs_per_sm(block_d, partials=2)
        n_splits, rows_per_split = tuning.persistent_split(tpg, max(1, cdiv(programs, max(1, bg * d_blocks))))
        n_splits = max(n_splits, 1)  # no tokens: one (empty) split
        broadcast = shift_shape[0] == 1 and batch != 1  # batch 0 too: its (zero) gradient keeps the 1
        direct = n_splits == 1 and not broadcast  # each program sums a whole group: write the gradients directly
        n_out = groups if broadcast else bg  # gradient rows
        n_red = n_splits * (batch if broadcast else 1)  # partial rows summed into each, adjacent: (b, g, split)
        # or, broadcast, (g, b, split)
        part_b, part_g = (n_splits, batch * n_splits) if broadcast else (groups * n_splits, n_splits)
        dshift = torch.empty((n_out, hidden), dtype=shift_dtype, device=x_btd.device)
        dscale = torch.empty((n_out, hidden), dtype=scale_dtype, device=x_btd.device)
        if direct:
            part_shift, part_scale = dshift, dscale
        else:
            parts = torch.empty((2, n_out, n_red, hidden), dtype=torch.float32, device=x_btd.device)
            part_shift, part_scale = parts[0], parts[1]
        if x_btd.numel():
            kernels("modulate").modulate_bwd(block_d, tpg < _FEW_TOKENS)[(bg * n_splits * d_blocks,)](
                dy_btd, x_btd, scale_bgd, dx_btd, part_shift, part_scale, groups, tpg, hidden, d_blocks, n_splits,
                rows_per_split, _batch_stride(scale_bgd), scale_bgd.stride(1), part_b, part_g, BLOCK_D=block_d,
            )
            if not direct:
                sum_partials(parts.view(2 * n_out, n_red, hidden), dshift, dscale)
        else:
            dshift.zero_()
            dscale.zero_()
        return dx_btd, dshift.reshape(shift_shape), dscale.reshape(scale_shape)


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
