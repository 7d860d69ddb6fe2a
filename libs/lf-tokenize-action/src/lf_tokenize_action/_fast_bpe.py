"""Quantized DCT coefficients <-> strings <-> byte-pair tokens (HF ``tokenizers``), for FAST.

A coefficient ``c`` in ``[min_coeff, max_coeff]`` becomes the character
``chr(CHAR_BASE + c - min_coeff)``; a chunk's ``H * D`` coefficients, flattened
low frequency first with the dimensions interleaved (C order of the ``(H, D)``
matrix, as the public ``physical-intelligence/fast`` processor does), form one
string. A ``tokenizers.models.BPE`` model without normalizer or pre-tokenizer is
trained on those strings with every alphabet character in its initial alphabet,
so every in-range coefficient string encodes, and concatenating the pieces of
the ids gives the string back exactly.

``CHAR_BASE = 0x100`` keeps the characters printable and away from ASCII
control and whitespace; the alphabet may hold up to ``0xD800 - 0x100`` values
(the surrogate block cannot appear in a string).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

CHAR_BASE = 0x100
MAX_ALPHABET = 0xD800 - CHAR_BASE


def rows_to_strings(codes_nl: np.ndarray) -> list[str]:
    """Non-negative int codes ``(n, L)`` (coefficient - min_coeff) -> n strings of length L.

    Raises:
        ValueError: a code outside ``[0, MAX_ALPHABET)`` (it would be a surrogate or past U+10FFFF);
            ``FastTokenizer.fit`` checks the range first and raises ``CoefficientRangeError``.
    """
    n, length = codes_nl.shape
    if codes_nl.size and (codes_nl.min() < 0 or codes_nl.max() >= MAX_ALPHABET):
        raise ValueError(f"coefficient codes must lie in [0, {MAX_ALPHABET}); got {codes_nl.min()}..{codes_nl.max()}")
    text = (codes_nl + CHAR_BASE).astype("<u4").tobytes().decode("utf-32-le")
    return [text[i * length : (i + 1) * length] for i in range(n)]


def string_to_codes(text: str) -> np.ndarray:
    """Inverse of ``rows_to_strings`` for one string: int64 codes ``(L,)``."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64) - CHAR_BASE


def train_bpe(strings: Iterable[str], *, alphabet_size: int, vocab_size: int, min_frequency: int) -> Tokenizer:
    """Train a BPE tokenizer whose vocabulary holds the whole alphabet plus merges, up to ``vocab_size`` ids."""
    bpe = Tokenizer(BPE())
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=[chr(CHAR_BASE + i) for i in range(alphabet_size)],
        limit_alphabet=alphabet_size,
    )
    bpe.train_from_iterator(strings, trainer=trainer)
    return bpe


def pieces_by_id(bpe: Tokenizer) -> list[str]:
    """The token string of every id ``0 .. vocab_size - 1`` (ids are dense in a trained BPE)."""
    vocab = bpe.get_vocab(with_added_tokens=False)
    pieces = [""] * len(vocab)
    for piece, i in vocab.items():
        pieces[i] = piece
    return pieces


def check_alphabet(bpe: Tokenizer, alphabet_size: int) -> None:
    """ValueError unless every alphabet character is a token of ``bpe`` (else some coefficients could not encode)."""
    vocab = bpe.get_vocab(with_added_tokens=False)
    missing = [i for i in range(alphabet_size) if chr(CHAR_BASE + i) not in vocab]
    if missing:
        raise ValueError(
            f"bpe vocabulary lacks {len(missing)} of the {alphabet_size} coefficient characters "
            f"(first: code {missing[0]}); it was not trained by FastTokenizer.fit for this alphabet"
        )
