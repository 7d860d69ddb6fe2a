"""Fused rotary position embedding with per-token cos/sin tables, forward and backward.

Legend: ``b`` batch, ``h`` heads, ``s`` seq, ``d`` head dim, ``r`` rotated features (``<= d``).
"""

from __future__ import annotations

from typing import Literal

import torch

from .._fused_reference import rotary_reference
from ._dispatch import FusedBackend, kernels, resolve_backend
from ._layout import cdiv, next_pow2, unit_last

__all__ = ["apply_rotary"]

_MAX_TILE = 8192  # features of one token held by one program (heads x head_dim); more heads take grid axis 1


def _table_strides(t: torch.Tensor) -> tuple[int, int]:
    """(batch stride, seq stride) of a ``(seq, r)`` or ``(b | 1, seq, r)`` table; 0 when broadcast."""
    if t.dim() == 2:
        return 0, t.stride(0)
    return (0 if t.shape[0] == 1 else t.stride(0)), t.stride(1)


def _launch(x_bhsd, cos, sin, backward: bool, interleaved: bool) -> torch.Tensor:
    x_bhsd = unit_last(x_bhsd)
    y_bhsd = torch.empty_like(x_bhsd)
    batch, heads, seq, head_dim = x_bhsd.shape
    rot_half = cos.shape[-1] // 2
    block_p = next_pow2(rot_half)
    block_h = min(next_pow2(heads), max(1, _MAX_TILE // (2 * block_p)))
    pass_dim = head_dim - 2 * rot_half
    n_tokens = batch * seq
    if n_tokens * heads == 0:
        return y_bhsd
    sc_b, sc_s = _table_strides(cos)
    head_blocks = cdiv(heads, block_h)
    kernels("rope").rotary(block_h, block_p)[lambda meta: (cdiv(n_tokens, meta["BLOCK_S"]), head_blocks)](
        x_bhsd, cos, sin, y_bhsd, n_tokens, seq, heads, head_dim, rot_half,
        x_bhsd.stride(0), x_bhsd.stride(1), x_bhsd.stride(2), y_bhsd.stride(0), y_bhsd.stride(1), y_bhsd.stride(2),
        sc_b, sc_s, INTERLEAVED=interleaved, BACKWARD=backward, HAS_PASS=pass_dim > 0,
        BLOCK_H=block_h, BLOCK_P=block_p, BLOCK_PASS=next_pow2(pass_dim),
    )
    return y_bhsd


class _RotaryFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_bhsd, cos, sin, interleaved):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return _launch(x_bhsd, cos, sin, backward=False, interleaved=interleaved)

    @staticmethod
    def backward(ctx, dy_bhsd):
        cos, sin = ctx.saved_tensors
        return _launch(dy_bhsd, cos, sin, backward=True, interleaved=ctx.interleaved), None, None, None


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq: int) -> None:
    if cos.shape != sin.shape:
        raise ValueError(f"apply_rotary: cos and sin shapes differ: {tuple(cos.shape)} vs {tuple(sin.shape)}")
    rot = cos.shape[-1]
    ok_lead = (cos.dim() == 2 and cos.shape[0] == seq) or (
        cos.dim() == 3 and cos.shape[0] in (1, x.shape[0]) and cos.shape[1] == seq)
    if not ok_lead or rot % 2 or rot == 0 or rot > x.shape[-1]:
        raise ValueError(
            f"apply_rotary: cos/sin must be (seq, rot) or (batch|1, seq, rot) with rot even and <= head_dim for "
            f"x (batch, heads, seq, head_dim) = {tuple(x.shape)}, got {tuple(cos.shape)}"
        )


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: Literal["bhsd", "bshd"] = "bhsd",
    interleaved: bool = False,
    backend: FusedBackend | None = None,
) -> torch.Tensor:
    """Rotate q or k features by per-token angles (RoPE, Su et al. 2021, arXiv 2104.09864).

    ``y = x * cos + rotate(x) * sin`` on the first ``rot = cos.shape[-1]``
    features, the rest passed through (partial rotary). ``rotate`` is HF
    transformers' ``rotate_half`` (pairs ``(i, i + rot/2)``) or, with
    ``interleaved=True``, the complex-pair form (``(2i, 2i+1)``, Wan). 1D RoPE,
    M-RoPE and 3D RoPE differ only in their tables (:mod:`._rope_tables`).
    Computed in float32, one read of ``x`` and the tables, one write of ``y``;
    any strides with a unit feature stride are read without a copy. The tables
    get no gradient.

    Args:
        x: ``(batch, heads, seq, head_dim)`` (``layout="bhsd"``) or ``(batch, seq, heads, head_dim)`` (``"bshd"``).
        cos, sin: ``(seq, rot)`` or ``(batch | 1, seq, rot)``, any float dtype (float32 recommended).
        layout: the order of ``x``'s dims; the output has the same.
        interleaved: complex-pair convention instead of rotate half.
        backend: ``"triton"`` / ``"reference"`` to force one; default picks (see ``kernel_backend``).

    Returns:
        Same shape and dtype as ``x``.

    Raises:
        ValueError: bad ranks, a sequence length mismatch, ``rot`` odd or larger than ``head_dim``.

    Example:
        >>> from lf_kernels.triton import rope_inv_freq, rope_tables
        >>> cos, sin = rope_tables(torch.arange(5), rope_inv_freq(8))
        >>> apply_rotary(torch.randn(2, 3, 5, 8), cos, sin).shape
        torch.Size([2, 3, 5, 8])
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"apply_rotary: layout must be 'bhsd' or 'bshd', got {layout!r}")
    if x.dim() != 4:
        raise ValueError(f"apply_rotary: x must be 4-D ({layout}), got shape {tuple(x.shape)}")
    x_bhsd = x if layout == "bhsd" else x.transpose(1, 2)
    _check(x_bhsd, cos, sin, x_bhsd.shape[2])
    if resolve_backend("apply_rotary", backend, x, cos, sin) == "reference":
        y_bhsd = rotary_reference(x_bhsd, cos, sin, interleaved=interleaved)
    else:
        y_bhsd = _RotaryFn.apply(x_bhsd, unit_last(cos), unit_last(sin), bool(interleaved))
    return y_bhsd if layout == "bhsd" else y_bhsd.transpose(1, 2)
