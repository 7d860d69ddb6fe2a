"""Action bins <-> token ids: appended after a text vocabulary, or taking over a reserved range.

Append mode (default): ids ``[0, base_vocab_size)`` belong to the text tokenizer;
action bin ``b`` is token ``base_vocab_size + b``, so the model's embedding table
grows to ``base_vocab_size + n_bins`` rows.

Reserved mode (``start=``): the bins take over ids ``[start, start + n_bins)`` of
the existing vocabulary (e.g. a tokenizer's reserved special tokens, or the
least-used ids as OpenVLA does); the vocabulary size is unchanged. With
``descending=True`` bin ``b`` is id ``start + n_bins - 1 - b``, OpenVLA's order
(``vocab_size - digitized``): ``ActionVocab(32000, 255, start=32000 - 255,
descending=True)`` with ``BinningTokenizer(n_bins=255)`` reproduces OpenVLA's
action token ids exactly (see the README).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._arrays import as_int_array, from_numpy, to_numpy
from ._io import check_header

FORMAT = "lf-tokenize-action/vocab"
VERSION = 2
READ_VERSIONS = (1, 2)


def _positive_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


class ActionVocab:
    """Maps action bins onto a contiguous range of token ids.

    Args:
        base_vocab_size: size of the text vocabulary (ids below it are text), >= 0.
        n_bins: number of action bins, >= 1 (``BinningTokenizer.n_bins``).
        start: ``None`` appends the bins after the text vocabulary; an int takes over
            ids ``[start, start + n_bins)``, which must lie inside ``[0, base_vocab_size)``.
        descending: map bin ``b`` to the ``b``-th id counted from the top of the range.

    Raises:
        ValueError: a non-int or out-of-range argument (message names it and the value).

    Example:
        >>> v = ActionVocab(base_vocab_size=32000, n_bins=256)
        >>> v.offset, v.vocab_size
        (32000, 32256)
        >>> v.to_token_ids([0, 255]).tolist()
        [32000, 32255]
        >>> v.to_bins([32000, 32255]).tolist()
        [0, 255]
    """

    def __init__(self, base_vocab_size: int, n_bins: int, *, start: int | None = None,
                 descending: bool = False) -> None:
        self.base_vocab_size: int = _positive_int(base_vocab_size, "base_vocab_size", 0)
        self.n_bins: int = _positive_int(n_bins, "n_bins", 1)
        self.start: int | None = None if start is None else _positive_int(start, "start", 0)
        if self.start is not None and self.start + self.n_bins > self.base_vocab_size:
            raise ValueError(f"start + n_bins = {self.start + self.n_bins} exceeds base_vocab_size "
                             f"{self.base_vocab_size}: a reserved range must lie inside the vocabulary")
        self.descending: bool = bool(descending)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, n_bins: int, *, reserved_tokens: list[str] | None = None,
                       descending: bool = False) -> ActionVocab:
        """The mapping for a HF ``tokenizers.Tokenizer`` (added tokens included).

        Without ``reserved_tokens`` the bins are appended after every id. With them,
        the bins take over those tokens' ids, which must be ``n_bins`` consecutive ids
        (e.g. ``[f"<|reserved_special_token_{i}|>" for i in range(256)]`` of Llama 3).

        Raises:
            ValueError: a reserved token is unknown, or their ids are not consecutive.
        """
        size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        if reserved_tokens is None:
            return cls(size, n_bins, descending=descending)
        if len(reserved_tokens) != n_bins:
            raise ValueError(f"reserved_tokens has {len(reserved_tokens)} tokens; n_bins is {n_bins}")
        ids = []
        for tok in reserved_tokens:
            i = tokenizer.token_to_id(tok)
            if i is None:
                raise ValueError(f"reserved token {tok!r} is not in the tokenizer's vocabulary")
            ids.append(int(i))
        if ids != list(range(ids[0], ids[0] + n_bins)):
            raise ValueError(f"reserved tokens must have consecutive ids; got {ids[:3]}... starting at {ids[0]}")
        return cls(size, n_bins, start=ids[0], descending=descending)

    @property
    def offset(self) -> int:
        """Lowest action token id (``base_vocab_size`` in append mode, else ``start``)."""
        return self.base_vocab_size if self.start is None else self.start

    @property
    def vocab_size(self) -> int:
        """The model's total vocabulary size: ``base_vocab_size + n_bins`` when appending,
        ``base_vocab_size`` when taking over a reserved range."""
        return self.base_vocab_size + (self.n_bins if self.start is None else 0)

    @property
    def text_vocab_size(self) -> int:
        """Ids below this are never action tokens in append mode (= ``base_vocab_size``)."""
        return self.base_vocab_size

    def _flip(self, arr: np.ndarray) -> np.ndarray:
        return self.n_bins - 1 - arr if self.descending else arr

    def to_token_ids(self, bins: Any) -> Any:
        """Bins (any shape) int in ``[0, n_bins)`` -> token ids int64, same shape.

        Torch input gives an int64 tensor on the same device.

        Raises:
            TypeError: non-integer dtype.
            ValueError: a bin outside ``[0, n_bins)`` (how many, and the first one).
        """
        arr, device = as_int_array(bins, name="bins", low=0, high=self.n_bins, what="bin indices")
        return from_numpy(self._flip(arr) + self.offset, device)

    def to_bins(self, token_ids: Any) -> Any:
        """Token ids (any shape) int -> bins int64 in ``[0, n_bins)``, same shape and type.

        Raises:
            TypeError: non-integer dtype.
            ValueError: an id outside ``[offset, vocab_size)``; the message says how
                many ids are out of range and gives the first offending id.
        """
        arr, device = as_int_array(
            token_ids, name="token_ids", low=self.offset, high=self.offset + self.n_bins, what="action token ids"
        )
        return from_numpy(self._flip(arr - self.offset), device)

    def is_action_token(self, token_ids: Any) -> Any:
        """Bool array (or tensor, for torch input) marking ids in ``[offset, vocab_size)``."""
        arr, device = to_numpy(token_ids, name="token_ids")
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"token_ids must have an integer dtype; got dtype {arr.dtype}")
        return from_numpy((arr >= self.offset) & (arr < self.offset + self.n_bins), device)

    def action_labels(self, token_ids: Any, *, ignore_index: int = -100) -> Any:
        """Labels for a next-token loss on action positions only.

        A copy of ``token_ids`` (any shape, int; numpy or torch) where every id that
        is not an action token is replaced by ``ignore_index`` (PyTorch's
        ``cross_entropy`` default), so text, image and padding positions add no loss.
        """
        arr, device = to_numpy(token_ids, name="token_ids")
        mask, _ = to_numpy(self.is_action_token(arr), name="mask")
        return from_numpy(np.where(mask, arr, ignore_index).astype(np.int64), device)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``format``, ``version``, ``base_vocab_size``, ``n_bins``, ``start``, ``descending``."""
        return {"format": FORMAT, "version": VERSION, "base_vocab_size": self.base_vocab_size, "n_bins": self.n_bins,
                "start": self.start, "descending": self.descending}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "dict") -> ActionVocab:
        """Inverse of ``to_dict``. Raises ValueError on another format/version or a missing field."""
        check_header(d, fmt=FORMAT, version=READ_VERSIONS, where=where)
        for field in ("base_vocab_size", "n_bins"):
            if field not in d:
                raise ValueError(f"{where}: missing field {field!r}")
        return cls(d["base_vocab_size"], d["n_bins"], start=d.get("start"), descending=d.get("descending", False))

    def __repr__(self) -> str:
        return (f"ActionVocab(base_vocab_size={self.base_vocab_size}, n_bins={self.n_bins}, "
                f"start={self.start}, descending={self.descending})")

    def _key(self) -> tuple[int, int, int | None, bool]:
        return (self.base_vocab_size, self.n_bins, self.start, self.descending)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ActionVocab):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())
