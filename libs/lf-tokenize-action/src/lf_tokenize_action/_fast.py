"""FAST action tokenizer (Pertsch et al. 2025, "FAST: Efficient Action Tokenization for
Vision-Language-Action Models", arXiv:2501.09747, sec. 4 and Alg. 1).

Pipeline for a chunk ``(H, D)`` = (horizon, action_dim) in action units:
normalize each dimension to [-1, 1] (the bounds of ``BinningTokenizer``:
q01/q99 by default), DCT-II (orthonormal) along time per dimension, multiply by
``scale`` and round to integers, flatten low frequency first with the
dimensions interleaved (C order of the ``(H, D)`` coefficient matrix, as the
public ``physical-intelligence/fast`` processor does), then byte-pair encode
(``_fast_bpe.py``). Decoding inverts every step; a token sequence that does not
give exactly ``H * D`` coefficients raises ``ActionDecodeError`` (or, with
``on_error="mask"``, yields NaN actions and a True in the failed-rows mask),
never zeros.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ._arrays import CUPY, as_float_array, check_finite, from_numpy, to_numpy
from ._bounds import (
    DEFAULT_STD_K,
    bounds_from_actions,
    bounds_from_stats_or_actions,
    normalize_unclipped,
    unnormalize,
    vector,
)
from ._dct import array_module, dct_time, idct_time, is_cupy_array
from ._errors import ActionDecodeError, CoefficientRangeError
from ._fast_bpe import MAX_ALPHABET, check_alphabet, pieces_by_id, rows_to_strings, string_to_codes, train_bpe
from ._fast_io import fast_kwargs_from_dict, fast_to_dict, token_rows
from ._fast_recon import ReconstructionStats, check_tolerance, measure, tolerance_vector
from ._io import read_json, write_json_atomic


def _int(value: Any, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (minimum is not None and value < minimum):
        raise ValueError(f"{name} must be an int{f' >= {minimum}' if minimum is not None else ''}; got {value!r}")
    return int(value)


def _scale(scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating)) or not np.isfinite(scale) \
            or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0; got {scale!r}")
    return float(scale)


class FastTokenizer:
    """DCT + scale-and-round + BPE action-chunk tokenizer (FAST). Build it with ``fit``.

    Args:
        low, high: float ``(D,)`` normalization bounds in action units (as ``BinningTokenizer``).
        bpe: a ``tokenizers.Tokenizer`` trained by ``fit`` (its vocabulary holds every
            coefficient character).
        scale: coefficients are ``round(scale * dct(normalized))``; > 0. Larger is finer
            (reconstruction L2 error <= ``0.5 / scale`` per coefficient) but needs more tokens.
        min_coeff, max_coeff: the integer coefficient range of the alphabet; coefficients
            outside it are clipped at encode time (and reported by ``return_clipped``).
        horizon: the chunk length H seen by ``fit``; the default for ``decode``.
        normalize_mask: optional bool ``(D,)``; False passes a dimension through unnormalized.
        reconstruction_error: the ``ReconstructionStats`` measured by ``fit`` on its chunks
            (``None`` for a tokenizer built by hand); kept by ``save`` / ``load``.

    Raises:
        ValueError: bad bounds, ``scale <= 0``, ``min_coeff > max_coeff``, a ``bpe``
            that lacks some coefficient character, or ``reconstruction_error`` not of ``(D,)``.

    Example:
        >>> t = np.linspace(0, 1, 10)[None, :, None]
        >>> chunks = np.concatenate([np.sin(3 * t + p) for p in np.linspace(0, 6, 40)], axis=0)  # (40, 10, 1)
        >>> tok = FastTokenizer.fit(chunks, scale=20, vocab_size=256)
        >>> tokens = tok.encode(chunks[:2])
        >>> all(len(t) < 10 for t in tokens)  # fewer tokens than the 10 values
        True
        >>> err = np.abs(tok.decode(tokens, horizon=10, action_dim=1) - chunks[:2])
        >>> bool(err.max() < 0.05)
        True
    """

    def __init__(
        self,
        low: Any,
        high: Any,
        *,
        bpe: Tokenizer,
        scale: float,
        min_coeff: int,
        max_coeff: int,
        horizon: int,
        normalize_mask: Any = None,
        reconstruction_error: ReconstructionStats | None = None,
    ) -> None:
        self.low, self.high = vector(low, "low"), vector(high, "high")
        if self.low.shape != self.high.shape or (self.low > self.high).any():
            raise ValueError(f"low and high must have one shape and low <= high; got {self.low} and {self.high}")
        mask = np.ones(self.low.shape, bool) if normalize_mask is None else np.asarray(normalize_mask)
        if mask.dtype != np.bool_ or mask.shape != self.low.shape:
            raise ValueError(f"normalize_mask must be a bool array of shape {self.low.shape}; got {mask!r}")
        self.normalize_mask = mask.copy()
        self.scale = _scale(scale)
        self.min_coeff, self.max_coeff = _int(min_coeff, "min_coeff"), _int(max_coeff, "max_coeff")
        if self.max_coeff < self.min_coeff or self.alphabet_size > MAX_ALPHABET:
            raise ValueError(
                f"need min_coeff <= max_coeff and at most {MAX_ALPHABET} values; got {min_coeff}..{max_coeff}"
            )
        self.horizon = _int(horizon, "horizon", 1)
        check_alphabet(bpe, self.alphabet_size)
        self.bpe = bpe
        self._pieces = pieces_by_id(bpe)
        if reconstruction_error is not None and (
            not isinstance(reconstruction_error, ReconstructionStats)
            or reconstruction_error.max_abs.shape != self.low.shape
            or reconstruction_error.rms.shape != self.low.shape
        ):
            raise ValueError(f"reconstruction_error must be a ReconstructionStats of ({self.action_dim},) arrays; "
                             f"got {reconstruction_error!r}")
        self.reconstruction_error: ReconstructionStats | None = reconstruction_error

    # ------------------------------------------------------------------ building
    @classmethod
    def fit(
        cls,
        chunks: Any,
        *,
        scale: float = 10.0,
        vocab_size: int = 1024,
        stats: Mapping[str, Sequence[float]] | Any = None,
        bounds: str = "q01_q99",
        std_k: float = DEFAULT_STD_K,
        normalize_mask: Any = None,
        min_frequency: int = 2,
        max_reconstruction_error: float | Sequence[float] | None = None,
    ) -> FastTokenizer:
        """Fit bounds (from ``stats`` if given, else from the chunks' actions), train the BPE, measure the error.

        The fitted tokenizer's ``reconstruction_error`` holds, per action dimension, the
        largest absolute and the RMS error of ``decode(encode(x)) - x`` over the fitting
        chunks, in action units (``_fast_recon.py``); ``save`` keeps it.

        Args:
            chunks: float ``(n, H, D)`` action chunks in action units (numpy or torch).
            scale: DCT scale (the paper's default is 10).
            vocab_size: BPE vocabulary size (alphabet + merges), >= the alphabet size
                ``max_coeff - min_coeff + 1`` seen in the data (FAST uses 1024 or 2048).
            stats: a LeRobot stats mapping, or a raw ``(N, D)`` action table (as ``BinningTokenizer.fit``).
            bounds, std_k, normalize_mask: as ``BinningTokenizer.fit`` / ``from_actions``.
            min_frequency: a pair must occur this often to be merged (public FAST: 2).
            max_reconstruction_error: optional tolerance in action units, one number or ``D``
                of them: fit raises when some dimension's max absolute error exceeds it.

        Raises:
            CoefficientRangeError: the integer coefficients span more than ``MAX_ALPHABET``
                values (the message gives the limit, the range measured on the chunks, the theoretical bound
                ``sqrt(H) * scale`` and a scale that fits).
            ReconstructionToleranceError: ``max_reconstruction_error`` exceeded (names the dimension).
            TypeError: ``stats`` neither a mapping nor an array.
            ValueError: chunks not ``(n, H, D)`` finite, bad ``scale``, or ``vocab_size`` below the
                alphabet size (the message gives both; lower ``scale`` or raise ``vocab_size``).
        """
        arr, _ = as_float_array(chunks, name="chunks")
        if arr.ndim != 3 or 0 in arr.shape:
            raise ValueError(f"chunks must have shape (n, H, D) with n, H, D >= 1; got shape {arr.shape}")
        n, horizon, dim = arr.shape
        vocab_size, scale = _int(vocab_size, "vocab_size", 1), _scale(scale)
        tolerance = None if max_reconstruction_error is None else tolerance_vector(max_reconstruction_error, dim)
        if stats is not None:
            low, high = bounds_from_stats_or_actions(stats, bounds, std_k)
        else:
            low, high = bounds_from_actions(arr.reshape(n * horizon, dim), bounds, std_k)
        mask = np.ones(dim, bool) if normalize_mask is None else normalize_mask
        norm = np.clip(normalize_unclipped(arr, low, high, mask)[0], -1.0, 1.0)
        coeffs = np.rint(dct_time(norm) * scale).astype(np.int64)
        lo, hi = int(coeffs.min()), int(coeffs.max())
        if hi - lo + 1 > MAX_ALPHABET:  # |dct| <= sqrt(H) for inputs in [-1, 1]: range <= 2 sqrt(H) scale + 1
            max_scale = float(np.floor((MAX_ALPHABET - 2) / (2.0 * np.sqrt(horizon)) * 1000) / 1000)
            raise CoefficientRangeError(min_coeff=lo, max_coeff=hi, limit=MAX_ALPHABET, scale=scale,
                                        max_scale=max_scale, horizon=horizon)
        if hi - lo + 1 > vocab_size:
            raise ValueError(
                f"vocab_size must be >= the coefficient alphabet size {hi - lo + 1} (coefficients {lo}..{hi} "
                f"at scale={scale}); got vocab_size={vocab_size}"
            )
        strings = rows_to_strings(coeffs.reshape(n, -1) - lo)
        bpe = train_bpe(strings, alphabet_size=hi - lo + 1, vocab_size=vocab_size, min_frequency=min_frequency)
        tok = cls(low, high, bpe=bpe, scale=scale, min_coeff=lo, max_coeff=hi, horizon=horizon, normalize_mask=mask)
        # coeffs lie in [lo, hi], so encode clips nothing more: decode(encode(arr)) == reconstruct(coeffs)
        tok.reconstruction_error = measure(tok.reconstruct(coeffs), arr)
        if tolerance is not None:
            bound_clip = np.abs(unnormalize(norm, tok.low, tok.high, tok.normalize_mask) - arr).max(axis=(0, 1))
            check_tolerance(tok.reconstruction_error, tolerance, bound_clip, scale)
        return tok

    # ------------------------------------------------------------------ properties
    @property
    def action_dim(self) -> int:
        """Number of action dimensions D."""
        return int(self.low.shape[0])

    @property
    def alphabet_size(self) -> int:
        """Number of distinct coefficient values, ``max_coeff - min_coeff + 1``."""
        return self.max_coeff - self.min_coeff + 1

    @property
    def vocab_size(self) -> int:
        """Number of token ids (``[0, vocab_size)``); at most the ``vocab_size`` asked of ``fit``."""
        return len(self._pieces)

    # ------------------------------------------------------------------ maps
    def quantize(self, chunks: Any) -> tuple[np.ndarray, np.ndarray]:
        """Chunks ``(n, H, D)`` action units -> int64 DCT coefficients ``(n, H, D)``, clipped rows bool ``(n,)``.

        A row is clipped when an action lay outside the bounds or a coefficient outside
        ``[min_coeff, max_coeff]``. numpy, torch (via numpy) and cupy (DCT on the GPU) inputs.

        Raises:
            ValueError: not ``(n, H, D)`` with ``D == action_dim``, or NaN/inf.
        """
        if is_cupy_array(chunks):
            xp, arr = array_module(chunks), chunks.astype("float64")
            if not bool(xp.isfinite(arr).all()):
                check_finite(arr.get(), name="chunks")
        else:
            xp, (arr, _) = np, as_float_array(chunks, name="chunks")
        if arr.ndim != 3 or arr.shape[-1] != self.action_dim or 0 in arr.shape:
            raise ValueError(f"chunks must have shape (n, H, {self.action_dim}); got shape {tuple(arr.shape)}")
        low, high, mask = (xp.asarray(v) for v in (self.low, self.high, self.normalize_mask))
        norm, out = normalize_unclipped(arr, low, high, mask, xp=xp)
        raw = xp.rint(dct_time(xp.clip(norm, -1.0, 1.0)) * self.scale)
        coeffs = xp.clip(raw, self.min_coeff, self.max_coeff).astype(xp.int64)
        clipped = out.any(axis=(1, 2)) | (coeffs != raw).any(axis=(1, 2))
        if xp is not np:
            return coeffs.get(), clipped.get()
        return coeffs, clipped

    def reconstruct(self, coeffs: Any) -> np.ndarray:
        """Int coefficients ``(n, H, D)`` -> actions float64 ``(n, H, D)``: ``unnormalize(idct(coeffs / scale))``."""
        arr, _ = to_numpy(coeffs, name="coeffs")
        norm = idct_time(arr.astype(np.float64) / self.scale)
        return unnormalize(norm, self.low, self.high, self.normalize_mask)

    def encode(self, chunks: Any, *, return_clipped: bool = False) -> Any:
        """Chunks ``(n, H, D)`` float (action units) -> ``n`` token lists (ids in ``[0, vocab_size)``).

        Returns ``tokens`` or ``(tokens, clipped)`` with ``clipped`` bool ``(n,)`` (see ``quantize``).

        Raises:
            ValueError: wrong shape or NaN/inf.
        """
        coeffs, clipped = self.quantize(chunks)
        strings = rows_to_strings(coeffs.reshape(coeffs.shape[0], -1) - self.min_coeff)
        tokens = [enc.ids for enc in self.bpe.encode_batch(strings, add_special_tokens=False)]
        return (tokens, clipped) if return_clipped else tokens

    def decode(
        self,
        token_lists: Any,
        *,
        horizon: int | None = None,
        action_dim: int | None = None,
        on_error: str = "raise",
        pad_id: int | None = None,
    ) -> Any:
        """Token sequences -> actions float64 ``(n, horizon, action_dim)`` in action units.

        Args:
            token_lists: a list of int sequences (lists, numpy arrays or 1-D torch
                tensors), or a 2-D int array/tensor ``(n, L)`` (then ``pad_id`` marks padding).
            horizon: H of the chunks (default: the ``horizon`` seen by ``fit``).
            action_dim: D; must equal ``self.action_dim`` (default).
            on_error: ``"raise"`` raises ``ActionDecodeError`` on the first bad row;
                ``"mask"`` returns ``(actions, failed)``: ``failed`` bool ``(n,)``, failed rows NaN.
            pad_id: if given, every occurrence of this id is dropped before decoding.

        Returns:
            ``actions`` (or ``(actions, failed)``); torch input gives float32 / bool tensors on its device.

        Raises:
            ActionDecodeError: (``on_error="raise"``) an id outside ``[0, vocab_size)`` or a
                coefficient count other than ``horizon * action_dim``; names the row and both lengths.
            ValueError: bad ``on_error``, ``horizon`` or ``action_dim``.
        """
        if on_error not in ("raise", "mask"):
            raise ValueError(f"on_error must be 'raise' or 'mask'; got {on_error!r}")
        horizon = self.horizon if horizon is None else _int(horizon, "horizon", 1)
        if action_dim is not None and action_dim != self.action_dim:
            raise ValueError(f"action_dim must be {self.action_dim} (the fitted D); got {action_dim!r}")
        rows, device = token_rows(token_lists)
        expected = horizon * self.action_dim
        coeffs = np.zeros((len(rows), expected), dtype=np.int64)
        failed = np.zeros(len(rows), dtype=bool)
        for r, ids in enumerate(rows):
            if pad_id is not None:
                ids = ids[ids != pad_id]
            error = self._decode_row(ids, r, expected, coeffs[r])
            if error is not None:
                if on_error == "raise":
                    raise error
                failed[r] = True
        actions = self.reconstruct(coeffs.reshape(len(rows), horizon, self.action_dim))
        actions[failed] = np.nan
        if device is not None:  # torch: float32 tensors; cupy: float64 like numpy
            actions = from_numpy(actions if device == CUPY else actions.astype(np.float32), device)
            failed = from_numpy(failed, device)
        return (actions, failed) if on_error == "mask" else actions

    def _decode_row(self, ids: np.ndarray, r: int, expected: int, out: np.ndarray) -> ActionDecodeError | None:
        bad = (ids < 0) | (ids >= self.vocab_size)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            reason = f"token id {int(ids[i])} at position {i} is outside [0, {self.vocab_size})"
            return ActionDecodeError(r, -1, expected, reason)
        codes = string_to_codes("".join([self._pieces[i] for i in ids.tolist()]))
        if codes.shape[0] != expected:
            reason = f"{len(ids)} tokens do not reshape to (horizon, action_dim)"
            return ActionDecodeError(r, int(codes.shape[0]), expected, reason)
        out[:] = codes + self.min_coeff
        return None

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (format ``lf-tokenize-action/fast``, version 1) with the BPE tokenizer JSON embedded.

        Fields: ``scale``, ``horizon``, ``min_coeff``, ``max_coeff``, ``low``, ``high``,
        ``normalize_mask`` and ``bpe`` (the object of ``tokenizers.Tokenizer.to_str()``).
        """
        return fast_to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "dict") -> FastTokenizer:
        """Inverse of ``to_dict``. Raises ValueError on another format/version or a missing/bad field."""
        return cls(**fast_kwargs_from_dict(d, where=where))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as JSON to ``path`` atomically."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> FastTokenizer:
        """Read a file written by ``save``; ValueError naming the file and field on mismatch."""
        return cls.from_dict(read_json(path), where=str(path))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FastTokenizer):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def __repr__(self) -> str:
        return (
            f"FastTokenizer(action_dim={self.action_dim}, horizon={self.horizon}, scale={self.scale}, "
            f"vocab_size={self.vocab_size}, alphabet={self.min_coeff}..{self.max_coeff}"
            + ("" if self.reconstruction_error is None else
               f", max_abs_error={np.array2string(self.reconstruction_error.max_abs, precision=4)}")
            + ")"
        )
