"""Action bins <-> token ids in a range reserved at the end of a model's vocabulary.

Layout: ids ``[0, base_vocab_size)`` belong to the text tokenizer; action bin
``b`` is token ``base_vocab_size + b``, so the model's embedding table grows to
``base_vocab_size + n_bins`` rows. (OpenVLA instead *overwrites* the last 256
ids of Llama's vocabulary, in reverse order; see the README.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._arrays import as_int_array, from_numpy, to_numpy
from ._io import check_header

FORMAT = "lf-tokenize-action/vocab"
VERSION = 1


def _positive_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


class ActionVocab:
    """Maps action bins onto token ids ``[base_vocab_size, base_vocab_size + n_bins)``.

    Args:
        base_vocab_size: size of the text vocabulary (ids below it are text), >= 0.
        n_bins: number of action bins, >= 1 (``BinningTokenizer.n_bins``).

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

    def __init__(self, base_vocab_size: int, n_bins: int) -> None:
        self.base_vocab_size: int = _positive_int(base_vocab_size, "base_vocab_size", 0)
        self.n_bins: int = _positive_int(n_bins, "n_bins", 1)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, n_bins: int) -> ActionVocab:
        """Reserve ids after every id of a HF ``tokenizers.Tokenizer`` (added tokens included).

        Uses ``tokenizer.get_vocab_size(with_added_tokens=True)`` as ``base_vocab_size``.
        """
        return cls(int(tokenizer.get_vocab_size(with_added_tokens=True)), n_bins)

    @property
    def offset(self) -> int:
        """Token id of action bin 0 (= ``base_vocab_size``)."""
        return self.base_vocab_size

    @property
    def vocab_size(self) -> int:
        """The model's total vocabulary size, ``base_vocab_size + n_bins``."""
        return self.base_vocab_size + self.n_bins

    def to_token_ids(self, bins: Any) -> Any:
        """Bins (any shape) int in ``[0, n_bins)`` -> token ids int64, same shape.

        Torch input gives an int64 tensor on the same device.

        Raises:
            TypeError: non-integer dtype.
            ValueError: a bin outside ``[0, n_bins)`` (how many, and the first one).
        """
        arr, device = as_int_array(bins, name="bins", low=0, high=self.n_bins, what="bin indices")
        return from_numpy(arr + self.offset, device)

    def to_bins(self, token_ids: Any) -> Any:
        """Token ids (any shape) int -> bins int64 in ``[0, n_bins)``, same shape and type.

        Raises:
            TypeError: non-integer dtype.
            ValueError: an id outside ``[offset, vocab_size)``; the message says how
                many ids are out of range and gives the first offending id.
        """
        arr, device = as_int_array(
            token_ids, name="token_ids", low=self.offset, high=self.vocab_size, what="action token ids"
        )
        return from_numpy(arr - self.offset, device)

    def is_action_token(self, token_ids: Any) -> Any:
        """Bool array (or tensor, for torch input) marking ids in ``[offset, vocab_size)``."""
        arr, device = to_numpy(token_ids, name="token_ids")
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"token_ids must have an integer dtype; got dtype {arr.dtype}")
        return from_numpy((arr >= self.offset) & (arr < self.vocab_size), device)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``format``, ``version``, ``base_vocab_size``, ``n_bins``."""
        return {"format": FORMAT, "version": VERSION, "base_vocab_size": self.base_vocab_size, "n_bins": self.n_bins}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "dict") -> ActionVocab:
        """Inverse of ``to_dict``. Raises ValueError on another format/version or a missing field."""
        check_header(d, fmt=FORMAT, version=VERSION, where=where)
        for field in ("base_vocab_size", "n_bins"):
            if field not in d:
                raise ValueError(f"{where}: missing field {field!r}")
        return cls(d["base_vocab_size"], d["n_bins"])

    def __repr__(self) -> str:
        return f"ActionVocab(base_vocab_size={self.base_vocab_size}, n_bins={self.n_bins})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ActionVocab):
            return NotImplemented
        return (self.base_vocab_size, self.n_bins) == (other.base_vocab_size, other.n_bins)

    def __hash__(self) -> int:
        return hash((self.base_vocab_size, self.n_bins))
