"""FlashAttention varlen backend for packed documents: the ``flash_attn`` package or torch's own kernel.

Packed sequences are rows of back-to-back documents; a varlen kernel (Dao 2023,
arXiv 2307.08691) takes them as one ``(total_tokens, heads, d)`` stream with
cumulative boundaries ``cu_seqlens`` and never touches a cross-document tile.
Each *run* of equal ``document_ids`` becomes one segment. That equals the dense
rule (same id may attend) only when every id forms one contiguous run per row;
:func:`document_segments` checks this and returns ``None`` otherwise, and the
caller falls back to a general backend.

Two kernels serve it, in this order:

1. ``flash_attn.flash_attn_varlen_func`` when the optional ``flash_attn`` package imports;
2. ``torch.nn.attention.varlen.varlen_attn`` (PyTorch's FlashAttention-2 varlen op with a backward,
   CUDA only). Its keyword set changed between releases: newer ones take ``scale``, ``window_size`` and
   ``enable_gqa``, older ones ``is_causal`` only; :func:`_torch_varlen` adapts (a non-default scale is folded
   into ``q``, GQA heads are expanded with ``repeat_interleave`` where ``enable_gqa`` is missing).

The segments depend on tensor data (one host synchronization), and every layer of a model asks for the same
``document_ids`` tensor: :func:`document_segments_cached` computes them once per tensor (and its in-place
version), see :mod:`lf_kernels._tensor_cache`.

Legend: ``b`` batch, ``h`` heads, ``s`` positions, ``t`` packed tokens (``b * s``), ``d`` head dim.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math

import torch

from ._tensor_cache import TensorKeyedCache

__all__ = ["attention_flash_varlen", "document_segments", "document_segments_cached", "torch_varlen_available",
           "varlen_available"]

_SEGMENTS = TensorKeyedCache(size=4)


def torch_varlen_available() -> bool:
    """Whether this torch ships ``torch.nn.attention.varlen.varlen_attn``."""
    return _torch_varlen_params() is not None


@functools.cache
def _torch_varlen_params() -> frozenset[str] | None:
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return None
    from torch.nn.attention import varlen

    fn = getattr(varlen, "varlen_attn", None)
    return None if fn is None else frozenset(inspect.signature(fn).parameters)


def varlen_available() -> bool:
    """Whether a varlen kernel exists here: the ``flash_attn`` package or torch's ``varlen_attn``."""
    return importlib.util.find_spec("flash_attn") is not None or torch_varlen_available()


def document_segments(document_ids: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``(cu_seqlens int32 (segments + 1,), max_seqlen)`` of the runs of ``document_ids (b, s)``.

    Runs never cross a row boundary. Returns ``None`` when some id appears in two
    separate runs of one row (then runs and ids disagree). Synchronizes with the device once.
    """
    batch, seq = document_ids.shape
    starts_bs = torch.ones_like(document_ids, dtype=torch.bool)
    starts_bs[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    # distinct ids per row: sort each row, count value changes (+1)
    sorted_bs = document_ids.sort(dim=1).values
    distinct_b = (sorted_bs[:, 1:] != sorted_bs[:, :-1]).sum(dim=1) + 1
    start_t = torch.nonzero(starts_bs.flatten(), as_tuple=True)[0]
    cu_seqlens = torch.cat([start_t, start_t.new_tensor([batch * seq])]).to(torch.int32)
    counts = torch.stack([starts_bs.sum(), distinct_b.sum(), (cu_seqlens[1:] - cu_seqlens[:-1]).max()]).tolist()
    runs, distinct, max_seqlen = (int(c) for c in counts)
    if distinct != runs:
        return None
    return cu_seqlens, max_seqlen


def document_segments_cached(document_ids: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """:func:`document_segments`, computed once per ``document_ids`` tensor (object and in-place version): the
    layers of one forward pass share one host synchronization."""
    return _SEGMENTS.get((document_ids,), (), lambda: document_segments(document_ids))


def _torch_varlen(q_thd, k_thd, v_thd, cu_seqlens, max_seqlen: int, *, causal: bool, scale: float):
    from torch.nn.attention.varlen import varlen_attn

    params = _torch_varlen_params()
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    else:
        kwargs["is_causal"] = causal
    if "scale" in params:
        kwargs["scale"] = scale
    elif not math.isclose(scale, 1.0 / math.sqrt(q_thd.shape[-1]), rel_tol=1e-12):
        q_thd = q_thd * (scale * math.sqrt(q_thd.shape[-1]))  # the op's fixed scale is 1 / sqrt(d)
    groups = q_thd.shape[1] // k_thd.shape[1]
    if groups > 1:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k_thd, v_thd = (t.repeat_interleave(groups, dim=1) for t in (k_thd, v_thd))
    return varlen_attn(q_thd, k_thd, v_thd, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)


def attention_flash_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: tuple[torch.Tensor, int],
    *,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """Varlen FlashAttention over ``segments`` (``flash_attn`` if installed, else torch's ``varlen_attn``).

    Args:
        q: ``(b, h_q, s, d)`` fp16 / bf16 on CUDA; k, v: ``(b, h_kv, s, d)``, ``h_q % h_kv == 0``.
        segments: ``(cu_seqlens, max_seqlen)`` from :func:`document_segments` over the ``b * s`` packed tokens.
        causal: causal within each segment (else full).
        scale: score scale.

    Returns:
        ``(b, h_q, s, d_v)`` in ``q.dtype``.
    """
    batch, heads_q, seq, _ = q.shape
    cu_seqlens, max_seqlen = segments

    def packed(x_bhsd: torch.Tensor) -> torch.Tensor:
        return x_bhsd.transpose(1, 2).reshape(batch * seq, x_bhsd.shape[1], x_bhsd.shape[3])

    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        flash_attn_varlen_func = None
    if flash_attn_varlen_func is not None:
        out_thd = flash_attn_varlen_func(
            packed(q), packed(k), packed(v), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
            dropout_p=0.0, softmax_scale=scale, causal=causal,
        )
    else:
        out_thd = _torch_varlen(packed(q), packed(k), packed(v), cu_seqlens, max_seqlen, causal=causal, scale=scale)
    return out_thd.reshape(batch, seq, heads_q, v.shape[3]).transpose(1, 2)
