"""FlexAttention backend (CUDA): a block mask built from :func:`mask_predicate`, compiled kernels.

FlexAttention (Dong et al. 2024, arXiv 2412.05496) takes the mask as a
``mask_mod(b, h, q_idx, kv_idx)`` function and skips the 128 x 128 tiles it
rules out entirely. The ``mask_mod`` here evaluates the same
:func:`~lf_kernels._mask.mask_predicate` as :func:`dense_mask`, plus padding
and document ids, so the dense and block-sparse forms cannot disagree.

Caching: the compiled ``flex_attention`` is built once per process; block masks
that depend only on the ``MaskSpec`` and the lengths are cached per
``(spec, q_len, kv_len, device)`` (a ``MaskSpec`` is hashable for this reason).
Masks with ``key_padding`` / ``document_ids`` depend on tensor data; they are built
(``create_block_mask(_compile=True)`` on CUDA: one fused pass over the tile grid) once per
those tensors (object and in-place version, :mod:`lf_kernels._tensor_cache`), so the layers of one
forward pass share one block mask.

CPU: FlexAttention has no CPU backward in torch 2.11-2.13, so the dispatcher
never sends CPU tensors here.

Legend: ``b`` batch, ``h`` heads, ``q`` query positions, ``k`` key positions, ``d`` head dim.
"""

from __future__ import annotations

import functools

import torch

from ._mask import MaskSpec, mask_predicate
from ._tensor_cache import TensorKeyedCache

__all__ = ["attention_flex", "block_mask_for", "flex_with_lse"]

_STATIC_CACHE_SIZE = 64
_DATA_MASKS = TensorKeyedCache(size=8)


@functools.cache
def _compiled_flex(dynamic: bool | None = None):
    """``torch.compile(flex_attention)``; ``dynamic=False`` builds one kernel per shape (see :func:`flex_with_lse`)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=dynamic)


def _mask_mod(spec: MaskSpec, offset: int, key_padding: torch.Tensor | None, document_ids: torch.Tensor | None):
    def mask_mod(b, h, q_idx, kv_idx):
        q_pos = q_idx + offset
        keep = mask_predicate(spec, q_pos, kv_idx)
        if key_padding is not None:
            keep = keep & key_padding[b, kv_idx]
        if document_ids is not None:
            keep = keep & (document_ids[b, q_pos] == document_ids[b, kv_idx])
        return keep

    return mask_mod


@functools.lru_cache(maxsize=_STATIC_CACHE_SIZE)
def _static_block_mask(spec: MaskSpec, q_len: int, kv_len: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    mask_mod = _mask_mod(spec, kv_len - q_len, None, None)
    on_cuda = torch.device(device).type == "cuda"
    return create_block_mask(mask_mod, None, None, q_len, kv_len, device=device, _compile=on_cuda)


def block_mask_for(
    spec: MaskSpec,
    q_len: int,
    kv_len: int,
    device: torch.device | str,
    *,
    key_padding: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
):
    """The FlexAttention ``BlockMask`` of a mask request (cached when it has no tensor data)."""
    from torch.nn.attention.flex_attention import create_block_mask

    device = torch.device(device)
    if key_padding is None and document_ids is None:
        return _static_block_mask(spec, q_len, kv_len, str(device))
    batch = (key_padding if key_padding is not None else document_ids).shape[0]

    def build():
        padding = key_padding.to(device) if key_padding is not None else None
        ids = document_ids.to(device) if document_ids is not None else None
        mask_mod = _mask_mod(spec, kv_len - q_len, padding, ids)
        return create_block_mask(mask_mod, batch, None, q_len, kv_len, device=device, _compile=device.type == "cuda")

    return _DATA_MASKS.get((key_padding, document_ids), (spec, q_len, kv_len, str(device)), build)


def attention_flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: MaskSpec,
    scale: float,
    *,
    key_padding: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compiled FlexAttention; returns ``(out (b, h, q, d) in q.dtype, lse (b, h, q) float32)``."""
    block_mask = block_mask_for(
        spec, q.shape[2], k.shape[2], q.device, key_padding=key_padding, document_ids=document_ids
    )
    return flex_with_lse(q, k, v, block_mask, scale)


def flex_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, scale: float,
                  *, static: bool = False):
    """Compiled FlexAttention on a ``BlockMask``; ``(out (b, h, q, d) in q.dtype, lse (b, h, q) float32)``.

    ``static=True`` uses a separate ``dynamic=False`` compile: once the shared compile has seen a second shape,
    torch recompiles it with symbolic lengths, and on an H200 (torch 2.11) that kernel ran the tile-order
    ``window_3d`` case (:mod:`lf_kernels._window_tiles`) at 9.2 ms against 5.5 ms compiled for its shape.
    """
    from torch.nn.attention import flex_attention as flex_module

    compiled = _compiled_flex(False if static else None)
    kwargs = {"block_mask": block_mask, "scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
    if hasattr(flex_module, "AuxRequest"):
        out, aux = compiled(q, k, v, return_aux=flex_module.AuxRequest(lse=True), **kwargs)
        return out, aux.lse
    return compiled(q, k, v, return_lse=True, **kwargs)  # torch < 2.9
