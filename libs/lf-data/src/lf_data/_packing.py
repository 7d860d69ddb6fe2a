"""Sequence packing: variable-length token samples into fixed-length rows, with the mask description.

Best-fit decreasing bin packing (Johnson 1973; at most 11/9 OPT + 6/9 rows):
samples sorted by length, each placed in the fullest row that still fits it.
Each row gets, per token (``rows`` x ``seq``):

- ``document_ids``: which packed sample the token belongs to (0, 1, ... per
  row; ``-1`` on padding). This is lf-kernels' ``document_ids`` argument: with
  ``MaskSpec("causal")`` it is the packed-documents ("varlen") mask.
- ``block_ids``: attention block inside the document, non-decreasing. A query
  attends to a key of the same document iff ``block_k <= block_q``. Causal
  tokens each have their own block; a prefix-LM prefix (PaLI / T5) shares block
  0; block-causal video frames share one block per frame. One rule covers the
  three (see :func:`packed_attention_mask`).
- ``position_ids`` restarting at 0 in each document; ``labels`` the next token
  of the same document where the loss applies, else ``ignore_index``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PackedBatch", "iter_packed", "pack_sequences", "packed_attention_mask", "packing_efficiency"]

IGNORE_INDEX = -100


@dataclass
class PackedBatch:
    """One micro-batch of packed rows; every tensor is ``(rows, seq)``."""

    input_ids: torch.Tensor
    """int64 token ids, ``pad_id`` on padding."""
    labels: torch.Tensor
    """int64 next-token targets, ``ignore_index`` where no loss applies (padding, document ends, prefixes)."""
    position_ids: torch.Tensor
    """int64 position inside the document (restarts at 0), 0 on padding."""
    document_ids: torch.Tensor
    """int32 document index inside the row, -1 on padding."""
    block_ids: torch.Tensor
    """int32 attention block inside the document (see module docstring), 0 on padding."""
    sample_index: list[list[int]]
    """Per row, the input positions of the samples it holds, in order."""

    @property
    def is_pad(self) -> torch.Tensor:
        """bool ``(rows, seq)``, True on padding."""
        return self.document_ids < 0


def _sample_fields(i: int, s: Mapping, seq_len: int, truncate: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if "input_ids" not in s:
        raise ValueError(f"sample {i} has no 'input_ids' (keys: {sorted(s)})")
    ids = np.asarray(s["input_ids"], dtype=np.int64).reshape(-1)
    n = len(ids)
    if n == 0:
        raise ValueError(f"sample {i} has no tokens")
    if "block_ids" in s:
        blocks = np.asarray(s["block_ids"], dtype=np.int64).reshape(-1)
        if len(blocks) != n or (np.diff(blocks) < 0).any():
            raise ValueError(f"sample {i}: block_ids must be non-decreasing with {n} entries")
        blocks = blocks - blocks[0]
    else:
        prefix = int(s.get("prefix_len", 0))
        if not 0 <= prefix <= n:
            raise ValueError(f"sample {i}: prefix_len must be in [0, {n}], got {prefix}")
        blocks = np.maximum(np.arange(n) - max(prefix - 1, 0), 0)
    if "loss_mask" in s:
        loss = np.asarray(s["loss_mask"], dtype=bool).reshape(-1)
        if len(loss) != n:
            raise ValueError(f"sample {i}: loss_mask has {len(loss)} entries, input_ids {n}")
    else:
        loss = np.arange(n) >= int(s.get("prefix_len", 0))
    if n > seq_len:
        if not truncate:
            raise ValueError(f"sample {i} has {n} tokens > seq_len={seq_len} (pass truncate=True "
                             "to keep its first seq_len tokens)")
        ids, blocks, loss = ids[:seq_len], blocks[:seq_len], loss[:seq_len]
    return ids, blocks, loss


def _best_fit_decreasing(lengths: Sequence[int], seq_len: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (free slots, row)
    for i in order:
        pos = bisect.bisect_left(free, (lengths[i], -1))
        if pos < len(free):
            slots, r = free.pop(pos)
        else:
            slots, r = seq_len, len(rows)
            rows.append([])
        rows[r].append(i)
        bisect.insort(free, (slots - lengths[i], r))
    return rows


def pack_sequences(samples: Sequence[Mapping], seq_len: int, *, rows_per_batch: int | None = None,
                   token_budget: int | None = None, pad_id: int = 0, ignore_index: int = IGNORE_INDEX,
                   truncate: bool = False) -> list[PackedBatch]:
    """Pack token samples into rows of ``seq_len`` by best-fit decreasing, grouped into micro-batches.

    Args:
        samples: mappings with ``input_ids`` (1-D ints, any modality already
            tokenized) and optionally ``prefix_len`` (int: the first tokens attend
            bidirectionally and carry no loss), ``block_ids`` (1-D non-decreasing
            ints: explicit attention blocks, e.g. one per video frame) and
            ``loss_mask`` (1-D bool: tokens that are prediction targets).
        seq_len: row length (tokens).
        rows_per_batch: rows per micro-batch; default ``token_budget // seq_len``,
            or all rows in one batch when neither is given.
        token_budget: tokens (slots) per micro-batch, a multiple of ``seq_len`` is best.
        pad_id / ignore_index: fill values of ``input_ids`` / ``labels``.
        truncate: keep the first ``seq_len`` tokens of longer samples instead of raising.

    Returns:
        Micro-batches; the last may have fewer rows. Every sample appears exactly once.

    Raises:
        ValueError: a sample has no ``input_ids``, bad ``block_ids``/``prefix_len``/``loss_mask``,
            or is longer than ``seq_len`` without ``truncate`` (names the sample position).

    Example:
        >>> b = pack_sequences([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}], seq_len=6)[0]
        >>> b.document_ids.tolist(), b.position_ids.tolist()
        ([[0, 0, 0, 1, 1, -1]], [[0, 1, 2, 0, 1, 0]])
    """
    if int(seq_len) < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if rows_per_batch is None and token_budget is not None:
        if token_budget < seq_len:
            raise ValueError(f"token_budget={token_budget} is below seq_len={seq_len}")
        rows_per_batch = token_budget // seq_len
    fields = [_sample_fields(i, s, seq_len, truncate) for i, s in enumerate(samples)]
    rows = _best_fit_decreasing([len(f[0]) for f in fields], seq_len)
    per = rows_per_batch or max(len(rows), 1)
    out = []
    for start in range(0, len(rows), per):
        group = rows[start:start + per]
        ids = np.full((len(group), seq_len), pad_id, np.int64)
        labels = np.full((len(group), seq_len), ignore_index, np.int64)
        pos = np.zeros((len(group), seq_len), np.int64)
        doc = np.full((len(group), seq_len), -1, np.int32)
        blk = np.zeros((len(group), seq_len), np.int32)
        for r, members in enumerate(group):
            at = 0
            for d, i in enumerate(members):
                tok, blocks, loss = fields[i]
                n = len(tok)
                ids[r, at:at + n], pos[r, at:at + n] = tok, np.arange(n)
                doc[r, at:at + n], blk[r, at:at + n] = d, blocks
                labels[r, at:at + n - 1] = np.where(loss[1:], tok[1:], ignore_index)
                at += n
        out.append(PackedBatch(*(torch.from_numpy(a) for a in (ids, labels, pos, doc, blk)), [list(g) for g in group]))
    return out


def _take(b: PackedBatch, rows: list[int]) -> PackedBatch:
    t = [getattr(b, f)[rows] for f in ("input_ids", "labels", "position_ids", "document_ids", "block_ids")]
    return PackedBatch(*t, [b.sample_index[r] for r in rows])


def _cat(parts: list[PackedBatch]) -> PackedBatch:
    t = [torch.cat([getattr(p, f) for p in parts]) for f in
         ("input_ids", "labels", "position_ids", "document_ids", "block_ids")]
    return PackedBatch(*t, [row for p in parts for row in p.sample_index])


def iter_packed(samples: Iterable[Mapping], seq_len: int, *, buffer_size: int = 4096,
                rows_per_batch: int | None = None, token_budget: int | None = None,
                carry_fill: float = 0.98, **kwargs) -> Iterator[PackedBatch]:
    """Stream :func:`pack_sequences` over a buffer of ``buffer_size`` samples (memory bounded by the buffer).

    After packing a full buffer, the samples of rows filled below ``carry_fill``
    go back to the buffer to be packed with the next samples, so padding stays at
    the stream's end. Micro-batches have ``rows_per_batch`` (or ``token_budget //
    seq_len``) rows, 1 by default; the last may have fewer. ``sample_index``
    counts from the start of the stream. Other keywords go to :func:`pack_sequences`.
    """
    per = rows_per_batch or (token_budget // seq_len if token_budget else 1)
    buf: list[tuple[int, Mapping]] = []
    ready: list[PackedBatch] = []

    def pack(final: bool) -> Iterator[PackedBatch]:
        nonlocal buf, ready
        b = pack_sequences([s for _, s in buf], seq_len, **kwargs)[0]
        fill = (b.document_ids >= 0).sum(dim=1).numpy() / seq_len
        keep = [r for r in range(len(fill)) if final or fill[r] >= carry_fill]
        index = [i for i, _ in buf]
        kept_rows = _take(b, keep)
        ready.append(PackedBatch(kept_rows.input_ids, kept_rows.labels, kept_rows.position_ids,
                                 kept_rows.document_ids, kept_rows.block_ids,
                                 [[index[i] for i in row] for row in kept_rows.sample_index]))
        kept = {i for r in keep for i in b.sample_index[r]}
        buf = [buf[i] for i in range(len(buf)) if i not in kept]
        rows = _cat(ready)
        n_full = len(rows.sample_index) if final else len(rows.sample_index) // per * per
        for start in range(0, n_full, per):
            yield _take(rows, list(range(start, min(start + per, n_full))))
        ready = [_take(rows, list(range(n_full, len(rows.sample_index))))]

    for pos, s in enumerate(samples):
        buf.append((pos, s))
        if len(buf) >= buffer_size:
            yield from pack(final=False)
    if buf:
        yield from pack(final=True)
    elif ready and ready[0].sample_index:
        rows = ready[0]
        for start in range(0, len(rows.sample_index), per):
            yield _take(rows, list(range(start, min(start + per, len(rows.sample_index)))))


def packed_attention_mask(document_ids: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Dense bool ``(rows, seq_q, seq_k)`` mask of packed rows: same document and ``block_k <= block_q``.

    Padding (document -1) attends to padding only, so no query row is empty.
    """
    same = document_ids[:, :, None] == document_ids[:, None, :]
    return same & (block_ids[:, None, :] <= block_ids[:, :, None])


def packing_efficiency(batches: Iterable[PackedBatch]) -> float:
    """Real tokens / slots over the batches (1.0 = no padding)."""
    real = slots = 0
    for b in batches:
        real += int((b.document_ids >= 0).sum())
        slots += b.document_ids.numel()
    return real / max(slots, 1)
