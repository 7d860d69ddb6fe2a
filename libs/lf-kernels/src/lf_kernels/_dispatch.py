"""Which attention backend serves a call: a pure function of the call's static facts.

:func:`choose_backend` decides from the mask, the lengths, the device type and
dtype and which extras (padding, documents, log-sum-exp) are present, so tests
can ask on a CPU what a CUDA call would take. Order of preference on CUDA:

1. ``"sdpa"`` / ``"sdpa_causal"``: no mask tensor at all (``full``, or
   ``causal`` with ``q_len == kv_len``; also ``block_causal`` with one token per
   frame and a ``window_3d`` wide enough to see everything), no padding, no
   documents, no log-sum-exp: cuDNN / flash kernels.
2. ``"sdpa_split"``: ``block_causal`` without padding or documents (the log-sum-exp
   is allowed, it comes for free), ``q_len == kv_len``, fp16 / bf16, where torch has
   the private cuDNN (or flash) SDPA ops: one causal cuDNN call over the sequence
   plus one batched causal call on the frame-reversed strict upper triangles, merged
   by log-sum-exp (:mod:`lf_kernels._split_attention`); no masked FLOPs, big calls.
   Target on an H200: >= 1.2x compiled FlexAttention (see ``bench/kernels/attention.py``).
3. ``"flex_tiles"``: ``window_3d`` without padding or documents, ``q_len == kv_len``, when
   :func:`lf_kernels._window_tiles.tile_order` finds a token order of 128-token boxes that keeps at most
   85% of the raster order's FlexAttention blocks (Wan 2.1 480p, window 3 x 9 x 9: 2,257 vs 3,570):
   FlexAttention on the reordered sequence (:mod:`lf_kernels._window_tiles`).
4. ``"flex"``: every other case with ``q_len >= FLEX_MIN_Q`` (FlexAttention,
   compiled, block-sparse; also returns the log-sum-exp). Packed documents go here too: with the block
   mask built once per ``document_ids`` tensor (:mod:`lf_kernels._flex`), Flex beat the FlashAttention-2
   varlen kernel on an H200 (torch 2.11, bf16 fwd+bwd, ``bench/results/varlen_docs_h200.json``): Llama-3
   rows of 8,192 tokens in documents of ~85 tokens 0.95 vs 1.71 ms, of ~1,365 tokens 2.14 vs 3.08 ms,
   8 images x 1,024 patches (16 x 80 heads) 1.06 vs 1.60 ms; building the mask costs 2.0-3.4 ms once per pass.
   Flex compiles once per shape; a run whose lengths change every batch may prefer varlen (below).
5. ``"flash_varlen"`` (where FlexAttention is missing): packed documents with ``full`` / ``causal``,
   ``q_len == kv_len``, no padding, no log-sum-exp, fp16 / bf16, when a varlen kernel exists (the
   ``flash_attn`` package, else torch's ``varlen_attn``, :mod:`lf_kernels._varlen`): the cross-document
   tiles are skipped, no mask is built, nothing is compiled.
6. ``"sdpa_frames"`` (only where FlexAttention and the split ops are missing): ``block_causal`` alone
   (no padding, documents or lse), ``q_len == kv_len``, at most :data:`MAX_FRAMES`
   frames: frame ``f``'s queries attend, unmasked, to the key prefix ending with
   frame ``f``, so one mask-free SDPA call per frame is exact with no masked FLOPs.
   Measured on an H200 (torch 2.11, 21 frames x 1,560 tokens, 12 x 128 heads, bf16
   fwd+bwd): 334 TFLOP/s against compiled FlexAttention's 345, so Flex goes first;
   the per-frame calls are too small to fill 132 SMs (wave quantization).
7. ``"sdpa_mask"`` (dense bool mask) or, for the log-sum-exp, ``"math"``.

On the CPU: 1, else ``"sdpa_mask"``, or ``"math"`` for the log-sum-exp
(FlexAttention has no CPU backward in torch 2.11-2.13, DESIGN.md).
"""

from __future__ import annotations

import importlib.util
from typing import Literal

import torch

from ._mask import MaskSpec

__all__ = ["Backend", "FLEX_MIN_Q", "MAX_FRAMES", "canonical_mask", "choose_backend", "select_backend"]

Backend = Literal[
    "sdpa", "sdpa_causal", "sdpa_mask", "math", "flex", "flex_tiles", "flash_varlen", "sdpa_frames", "sdpa_split"
]

FLEX_MIN_Q = 128
"""Below this many queries a dense mask is small and FlexAttention's compile is not worth it."""
MAX_FRAMES = 64
"""``sdpa_frames`` launches one SDPA call per frame; beyond this, launch overhead favours FlexAttention."""

_HALF = (torch.float16, torch.bfloat16)


def flash_attn_available() -> bool:
    """Whether a FlashAttention varlen kernel can serve packed documents: the optional ``flash_attn``
    package, or torch's ``torch.nn.attention.varlen.varlen_attn``."""
    from ._varlen import varlen_available

    return varlen_available()


def flex_available() -> bool:
    """Whether this torch ships FlexAttention."""
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def canonical_mask(mask: MaskSpec, q_len: int, kv_len: int) -> MaskSpec:
    """An equivalent simpler ``MaskSpec`` where one exists (same dense mask for these lengths).

    ``block_causal`` with ``frame_tokens == 1`` is ``causal``; with ``frame_tokens >=
    kv_len`` and ``q_len <= kv_len`` it is ``full``; ``prefix_lm`` with ``prefix_len
    == 0`` is ``causal`` and with ``prefix_len >= kv_len`` (``q_len <= kv_len``)
    ``full``; a non-causal ``window_3d`` whose half-widths reach across its grid is ``full``.
    """
    kind = mask.kind
    if kind == "block_causal" and mask.frame_tokens == 1:
        return MaskSpec("causal")
    if kind == "prefix_lm" and mask.prefix_len == 0:
        return MaskSpec("causal")
    if q_len <= kv_len and (
        (kind == "block_causal" and mask.frame_tokens >= kv_len)
        or (kind == "prefix_lm" and mask.prefix_len >= kv_len)
        or (kind == "window_3d" and not mask.causal_t
            and all(w // 2 >= n - 1 for w, n in zip(mask.window, mask.grid, strict=True)))
    ):
        return MaskSpec("full")
    return mask


def choose_backend(
    mask: MaskSpec,
    q_len: int,
    kv_len: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    has_key_padding: bool = False,
    has_documents: bool = False,
    return_lse: bool = False,
    flash_attn: bool | None = None,
    flex: bool | None = None,
    split: bool | None = None,
) -> Backend:
    """Name the backend :func:`attention` takes for this case (order in the module docstring).

    Args:
        mask: the mask description.
        q_len, kv_len: query and key lengths.
        device: where the tensors live; only its type (``"cpu"`` / ``"cuda"``) matters.
        dtype: the q/k/v dtype.
        has_key_padding, has_documents: whether ``key_padding`` / ``document_ids`` are given.
        return_lse: whether the log-sum-exp is wanted.
        flash_attn, flex, split: override the detection of a varlen kernel / FlexAttention / the
            private cuDNN-or-flash SDPA ops ``sdpa_split`` calls (``None``: detect), so tests can
            ask about machines unlike this one.

    Returns:
        one of ``"sdpa"``, ``"sdpa_causal"``, ``"sdpa_split"``, ``"flex_tiles"``, ``"flash_varlen"``,
        ``"sdpa_frames"``, ``"flex"``, ``"sdpa_mask"``, ``"math"``.

    Example:
        >>> choose_backend(MaskSpec("block_causal", frame_tokens=1560), 32760, 32760,
        ...                device="cuda", dtype=torch.bfloat16, return_lse=True, flex=True, split=True)
        'sdpa_split'
        >>> choose_backend(MaskSpec("block_causal", frame_tokens=1560), 32760, 32760,
        ...                device="cuda", dtype=torch.bfloat16, return_lse=True, flex=True, split=False)
        'flex'
    """
    mask = canonical_mask(mask, q_len, kv_len)
    plain = not (has_key_padding or has_documents or return_lse)
    if plain and mask.kind == "full":
        return "sdpa"
    if plain and mask.kind == "causal" and q_len == kv_len:
        return "sdpa_causal"
    if torch.device(device).type == "cuda":
        if flash_attn is None:
            flash_attn = flash_attn_available()
        if flex is None:
            flex = flex_available()
        if split is None:
            from ._split_kernels import split_ops_available

            split = split_ops_available()
        if (
            split and mask.kind == "block_causal" and not has_key_padding and not has_documents
            and q_len == kv_len and dtype in _HALF
        ):
            return "sdpa_split"
        if flex and q_len >= FLEX_MIN_Q and dtype in (*_HALF, torch.float32):
            if mask.kind == "window_3d" and not has_key_padding and not has_documents and q_len == kv_len:
                from ._window_tiles import tile_order

                if tile_order(mask).tile is not None:
                    return "flex_tiles"
            return "flex"
        if (
            flash_attn and has_documents and not has_key_padding and not return_lse and q_len == kv_len
            and mask.kind in ("full", "causal") and dtype in _HALF
        ):
            return "flash_varlen"
        if (
            plain and mask.kind == "block_causal" and q_len == kv_len
            and -(-kv_len // mask.frame_tokens) <= MAX_FRAMES
        ):
            return "sdpa_frames"
    return "math" if return_lse else "sdpa_mask"


def select_backend(
    mask: MaskSpec, q_len: int, kv_len: int, *, has_key_padding: bool, return_lse: bool,
    has_documents: bool = False,
) -> Backend:
    """The backend a CPU call takes: :func:`choose_backend` with ``device="cpu"`` (kept for 0.1 callers)."""
    return choose_backend(
        mask, q_len, kv_len, has_key_padding=has_key_padding, has_documents=has_documents, return_lse=return_lse
    )
