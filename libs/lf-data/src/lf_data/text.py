"""Word-level instruction tokenizer (HF ``tokenizers``) for short robot instructions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

__all__ = ["build_instruction_tokenizer", "encode_instructions", "PAD_ID", "UNK_ID"]

PAD_ID = 0
UNK_ID = 1


def build_instruction_tokenizer(texts: Iterable[str]) -> Tokenizer:
    """A ``WordLevel`` tokenizer over the lowercased words of ``texts``.

    Text is lowercased (``normalizers.Lowercase``) and split on whitespace and
    punctuation (``pre_tokenizers.Whitespace``: runs of word characters, runs of
    other non-space characters). Ids: ``[PAD]`` = 0, ``[UNK]`` = 1, then the
    words in sorted order from 2, so the ids depend only on the set of words.

    Args:
        texts: instructions to build the vocabulary from.

    Returns:
        ``tokenizers.Tokenizer``; unknown words encode to ``[UNK]``.

    Example:
        >>> tok = build_instruction_tokenizer(["Push the puck", "reach the goal"])
        >>> tok.encode("push the goal").ids
        [4, 6, 2]
    """
    tok = Tokenizer(models.WordLevel({"[PAD]": PAD_ID, "[UNK]": UNK_ID}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = set()
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"texts must be str, got {type(text).__name__}")
        norm = tok.normalizer.normalize_str(text)
        words.update(w for w, _ in tok.pre_tokenizer.pre_tokenize_str(norm))
    vocab = {"[PAD]": PAD_ID, "[UNK]": UNK_ID}
    vocab.update({w: i + 2 for i, w in enumerate(sorted(words - set(vocab)))})
    tok.model = models.WordLevel(vocab, unk_token="[UNK]")
    tok.add_special_tokens(["[PAD]", "[UNK]"])
    return tok


def encode_instructions(tok: Tokenizer, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and mask of a batch of instructions, right-padded to ``max_len``.

    Args:
        tok: a tokenizer from :func:`build_instruction_tokenizer`.
        texts: ``n`` instructions.
        max_len: ``L`` >= 1. Longer instructions are truncated to their first ``L``
            tokens (no error).

    Returns:
        ``ids`` int64 ``(n, L)`` padded with ``[PAD]`` = 0, and ``mask`` bool
        ``(n, L)``, True on real tokens.

    Example:
        >>> ids, mask = encode_instructions(tok, ["push the puck"], 5)  # doctest: +SKIP
        >>> mask.tolist()
        [[True, True, True, False, False]]
    """
    if int(max_len) < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    texts = list(texts)
    ids = np.full((len(texts), max_len), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(texts), max_len), dtype=bool)
    for row, enc in enumerate(tok.encode_batch(texts, add_special_tokens=False)):
        seq = enc.ids[:max_len]
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = True
    return ids, mask
