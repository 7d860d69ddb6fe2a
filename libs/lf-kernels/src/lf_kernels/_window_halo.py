"""``window_3d`` attention as dense attention over query tiles and their key halos ("tile + halo").

The (T, H, W) grid is cut into query tiles of ``(1, a, b)`` tokens (the grid padded so every tile is
full). The keys a tile's queries may see lie in its halo of ``(et, a + 2 rh, b + 2 rw)`` tokens
(``et = 2 rt + 1`` frames, or ``rt + 1`` past frames with ``causal_t``; radii clipped to the grid,
``r = min(w // 2, n - 1)``, which changes no kept pair). Which halo key a query sees depends only
on their relative offset (translation invariance), except at the grid border, where a halo slot
falls outside the grid: exactly "key is padding". So one fixed ``(a*b, halo)`` pattern AND a
per-tile key mask give the exact ``window_3d`` mask, and one batched attention call over all
tiles computes it: ``computed / kept`` entries 3.8 at the bench shape (grid 21x30x52, window
(3, 9, 9), tile 10x6) where FlexAttention's 128 x 128 blocks (all partial) compute 8.6.

Layout: q, k, v are gathered with one ``index_select`` each into tile-major buffers; GQA folds
the ``g = heads_q / heads_kv`` query heads into the tile's query axis (query slot order
``(a*b, g)``), so k/v halos are never repeated. Padding slots (queries outside the grid, halo
keys outside it) gather row 0 instead of a zero row: those keys are masked (probability exactly
0, so they add 0 to out, dk and dv) and those queries are dropped when the output is gathered
back (their zero upstream gradient makes their dq contribution 0). Backward is autograd through
``index_select`` (``index_add`` into the sequence; atomics on CUDA, so not bit-deterministic).
Padded query rows, and real rows that key padding empties, are un-masked for the kernel and
their output zeroed (cuDNN returns NaN gradients for all-masked rows, see ``_attention``).

Kernels: ``"sdpa"`` (SDPA with an additive bias, cuDNN then memory-efficient on CUDA; no lse)
or ``"flex"`` (FlexAttention on the small batched layout, mask as a lookup table; returns lse).

Legend: ``b`` batch, ``n`` tiles, ``h`` kv heads, ``g`` query heads per kv head, ``s`` sequence,
``q`` query slots of a tile (``a*b*g``), ``k`` halo slots, ``d`` head dim.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ._halo_layout import HaloLayout, choose_tile, halo_layout, row_indices
from ._mask import MaskSpec

__all__ = ["HaloKernel", "attention_window_halo"]

HaloKernel = Literal["sdpa", "flex"]
_CUDA_PRIORITY = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _allowed_bnqk(layout: HaloLayout, group: int, key_ok_bnk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(allowed (bn, q, k), row_ok (bn, q))`` bools; rows with no allowed key are un-masked in ``allowed``."""
    base_bnqk = layout.pattern.repeat_interleave(group, dim=0)[None] & key_ok_bnk[:, None, :]
    row_ok = base_bnqk.any(dim=-1)
    return base_bnqk | ~row_ok[..., None], row_ok


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, -math.inf)


@functools.lru_cache(maxsize=8)
def _static_mask(layout: HaloLayout, group: int, batch: int, kernel: str, dtype: torch.dtype):
    """The key-padding-free mask, as an additive bias ``(b*n, 1, q, k)`` or a flex ``BlockMask``.

    Without key padding a real query always sees itself, so only padded query rows can be empty;
    they are un-masked and dropped later, hence no zeroing is needed.
    """
    allowed, _ = _allowed_bnqk(layout, group, layout.k_real)
    allowed = allowed.repeat(batch, 1, 1) if batch > 1 else allowed
    return _flex_block_mask(allowed) if kernel == "flex" else _additive(allowed, dtype)[:, None]


def _flex_block_mask(allowed_bqk: torch.Tensor):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return allowed_bqk[b, q_idx, kv_idx]

    on_cuda = allowed_bqk.device.type == "cuda"
    return create_block_mask(mask_mod, allowed_bqk.shape[0], None, allowed_bqk.shape[1], allowed_bqk.shape[2],
                             device=allowed_bqk.device, _compile=on_cuda)


def _run_kernel(kernel, q, k, v, allowed, scale):
    """Attention over tiles: ``q (bn, h, q, d)``, ``k/v (bn, h, k, d)``; returns ``(out, lse | None)``."""
    if kernel == "flex":
        from torch.nn.attention import flex_attention as flex_module

        from ._flex import _compiled_flex

        fn = _compiled_flex() if q.device.type == "cuda" else flex_module.flex_attention
        out, aux = fn(q, k, v, block_mask=allowed, scale=scale, return_aux=flex_module.AuxRequest(lse=True))
        return out, aux.lse
    if q.device.type == "cuda":
        with sdpa_kernel(_CUDA_PRIORITY, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale), None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale), None


def attention_window_halo(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: MaskSpec,
    scale: float,
    *,
    key_padding: torch.Tensor | None = None,
    tile: tuple[int, int] | None = None,
    kernel: HaloKernel = "sdpa",
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact ``window_3d`` self-attention through the tile + halo decomposition (module docstring).

    Args:
        q: ``(batch, heads_q, seq, head_dim)``; ``seq = T * H * W`` of ``spec.grid``.
        k: ``(batch, heads_kv, seq, head_dim)``; ``heads_q % heads_kv == 0`` (checked by the caller).
        v: ``(batch, heads_kv, seq, head_dim_v)``.
        spec: a ``window_3d`` :class:`MaskSpec`.
        scale: score scale.
        key_padding: optional ``(batch, seq)`` bool, ``True`` = real token.
        tile: ``(a, b)`` query tile; default :func:`lf_kernels._halo_layout.choose_tile`.
        kernel: ``"sdpa"`` or ``"flex"`` (FlexAttention on the batched tiles; needed for ``return_lse``).
        return_lse: also return the log-sum-exp ``(batch, heads_q, seq)`` float32 (flex only).

    Returns:
        ``out (batch, heads_q, seq, head_dim_v)`` in ``q.dtype`` (a ``(b, s, h, d)``-contiguous view), or
        ``(out, lse)``. Rows with no allowed key (all padded): ``out = 0``, ``lse = -inf``.

    Raises:
        ValueError: not ``window_3d``; ``q_len != kv_len`` or grid not holding it; ``return_lse`` with
            ``kernel="sdpa"``; an unknown ``kernel``; a tile side < 1. (Shapes, GQA ratio and
            ``key_padding`` are validated by :func:`lf_kernels._attention.attention`.)

    Example:
        >>> spec = MaskSpec("window_3d", grid=(3, 5, 7), window=(3, 3, 5))
        >>> q, k, v = torch.randn(1, 4, 105, 16), torch.randn(1, 2, 105, 16), torch.randn(1, 2, 105, 16)
        >>> attention_window_halo(q, k, v, spec, 0.25, tile=(4, 4)).shape
        torch.Size([1, 4, 105, 16])
    """
    batch, heads_q, seq, _ = q.shape
    heads_kv, group, dim_v = k.shape[1], q.shape[1] // k.shape[1], v.shape[-1]
    if spec.kind != "window_3d" or math.prod(spec.grid) != seq or k.shape[2] != seq:
        raise ValueError(f"attention_window_halo needs window_3d self-attention on its grid, got {spec!r}, "
                         f"q_len={seq}, kv_len={k.shape[2]}")
    if kernel not in ("sdpa", "flex"):
        raise ValueError(f"kernel must be 'sdpa' or 'flex', got {kernel!r}")
    if return_lse and kernel != "flex":
        raise ValueError("return_lse=True needs kernel='flex' (SDPA does not return the log-sum-exp)")
    layout = halo_layout(spec, tuple(tile) if tile is not None else choose_tile(spec, group), str(q.device))
    n, ab, halo = layout.n_tiles, layout.q_index.shape[1], layout.halo
    q_rows, k_rows, out_rows = row_indices(layout, batch, seq, heads_kv)
    # (b, h_q, s, d) -> rows (b*s*h_kv, g*d) -> (b*n, h_kv, ab*g, d); k/v -> (b*n, h_kv, halo, d).
    q_bnhq = q.transpose(1, 2).reshape(batch * seq * heads_kv, -1).index_select(0, q_rows)
    q_bnhq = q_bnhq.view(batch * n, heads_kv, ab * group, -1)
    k_bnhk, v_bnhk = (t.transpose(1, 2).reshape(batch * seq * heads_kv, -1).index_select(0, k_rows)
                      .view(batch * n, heads_kv, halo, -1) for t in (k, v))
    row_ok = None
    if key_padding is not None:
        key_ok_bnk = (layout.k_real[None] & key_padding.to(q.device)[:, layout.k_index]).reshape(batch * n, halo)
        allowed, row_ok = _allowed_bnqk(layout, group, key_ok_bnk)
        mask = _flex_block_mask(allowed) if kernel == "flex" else _additive(allowed, q.dtype)[:, None]
    else:
        mask = _static_mask(layout, group, batch, kernel, q.dtype)
    out, lse = _run_kernel(kernel, q_bnhq, k_bnhk, v_bnhk, mask, scale)
    if row_ok is not None:
        out = out * row_ok[:, None, :, None].to(out.dtype)
        if lse is not None:
            lse = lse.masked_fill(~row_ok[:, None], -math.inf)
    out = out.reshape(-1, group * dim_v).index_select(0, out_rows).view(batch, seq, heads_q, dim_v).transpose(1, 2)
    if not return_lse:
        return out
    lse = lse.reshape(-1, group).index_select(0, out_rows).view(batch, seq, heads_q).transpose(1, 2)
    return out, lse
