"""Exact fraction of the ``seq x seq`` score matrix a mask keeps (for the cost model).

Closed forms per kind (self-attention, ``q_len == kv_len == seq``):

- ``full``: 1; ``causal``: ``(seq + 1) / (2 seq)``.
- ``prefix_lm`` (``p = min(prefix_len, seq)``): ``p^2 + (seq (seq + 1) - p (p + 1)) / 2`` entries.
- ``block_causal``: frame ``f`` holds ``n_f`` rows, each seeing every key up to
  the end of frame ``f``: ``sum_f n_f * min((f + 1) F, seq)``.
- ``window_3d``: the rule is a product of independent per-axis rules, so the
  count is the product of per-axis pair counts ``#{(a, b) in [0, n)^2 : |a - b| <= r}``
  ``= n + 2 sum_{d=1..min(r, n-1)} (n - d)`` (one-sided along t with ``causal_t``).

With ``document_ids`` the count depends on the data: it is counted exactly from
the mask rows, a block of queries at a time.
"""

from __future__ import annotations

import torch

from ._mask import MaskSpec, check_mask_inputs, mask_predicate

__all__ = ["keep_fraction", "kept_entries"]

_ROWS_PER_BLOCK = 1024


def _axis_pairs(n: int, radius: int, one_sided: bool) -> int:
    near = sum(n - d for d in range(1, min(radius, n - 1) + 1))
    return n + (1 if one_sided else 2) * near


def kept_entries(spec: MaskSpec, seq: int, *, document_ids: torch.Tensor | None = None) -> int:
    """Number of ``True`` entries of ``dense_mask(spec, seq, seq, document_ids=...)``, summed over batch.

    Raises:
        ValueError, TypeError: as :func:`dense_mask` (e.g. a ``window_3d`` grid not holding ``seq`` tokens).
    """
    check_mask_inputs(spec, seq, seq, None, document_ids)
    if document_ids is not None:
        total = 0
        for start in range(0, seq, _ROWS_PER_BLOCK):
            stop = min(start + _ROWS_PER_BLOCK, seq)
            total += int(_mask_rows(spec, seq, start, stop, document_ids).sum())
        return total
    if spec.kind == "full":
        return seq * seq
    if spec.kind == "causal":
        return seq * (seq + 1) // 2
    if spec.kind == "prefix_lm":
        p = min(spec.prefix_len, seq)
        return p * p + (seq * (seq + 1) - p * (p + 1)) // 2
    if spec.kind == "block_causal":
        frame = spec.frame_tokens
        return sum(min(frame, seq - start) * min(start + frame, seq) for start in range(0, seq, frame))
    (t_size, h_size, w_size), (wt, wh, ww) = spec.grid, spec.window
    return (
        _axis_pairs(t_size, wt // 2, spec.causal_t) * _axis_pairs(h_size, wh // 2, False)
        * _axis_pairs(w_size, ww // 2, False)
    )


def _mask_rows(spec: MaskSpec, seq: int, start: int, stop: int, document_ids: torch.Tensor) -> torch.Tensor:
    """Rows ``start:stop`` of the self-attention mask with documents, without building the rest."""
    q_pos = torch.arange(start, stop, device=document_ids.device)
    k_pos = torch.arange(seq, device=document_ids.device)
    rows_qk = mask_predicate(spec, q_pos[:, None], k_pos[None, :])
    same_doc_bqk = document_ids[:, start:stop, None] == document_ids[:, None, :]
    return rows_qk[None] & same_doc_bqk


def keep_fraction(spec: MaskSpec, seq: int, *, document_ids: torch.Tensor | None = None) -> float:
    """Exact fraction of the ``(seq, seq)`` score entries that ``spec`` keeps (self-attention).

    Attention FLOPs of a block-sparse kernel scale with this fraction (the dense
    term ``4 * seq^2 * head_dim`` per head times it). With ``document_ids``
    ``(batch, seq)`` the fraction is over ``batch * seq * seq`` entries.

    Args:
        spec: the mask description.
        seq: tokens per sequence (>= 1).
        document_ids: optional packed-document ids, as in :func:`dense_mask`.

    Returns:
        float in ``(0, 1]``.

    Raises:
        ValueError: ``seq < 1``; otherwise as :func:`dense_mask`.

    Example:
        >>> keep_fraction(MaskSpec("causal"), 4)
        0.625
        >>> keep_fraction(MaskSpec("block_causal", frame_tokens=2), 4)
        0.75
    """
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"seq must be an int >= 1, got {seq!r}")
    batch = 1 if document_ids is None else document_ids.shape[0]
    return kept_entries(spec, seq, document_ids=document_ids) / (batch * seq * seq)
