"""Typed errors of lf-tokenize-action."""

from __future__ import annotations


class ActionDecodeError(ValueError):
    """A token sequence does not decode to an action chunk of the expected shape.

    Raised by ``FastTokenizer.decode`` (with ``on_error="raise"``) instead of
    returning zeros. Subclass of ``ValueError``.

    Attributes:
        row: index of the failing sequence in the batch.
        got: number of DCT coefficients the sequence decoded to (``-1`` when an
            id was invalid and nothing could be decoded).
        expected: ``horizon * action_dim``.
        reason: one line saying what went wrong.
    """

    def __init__(self, row: int, got: int, expected: int, reason: str) -> None:
        self.row, self.got, self.expected, self.reason = row, got, expected, reason
        super().__init__(f"token sequence {row}: {reason} (decoded {got} coefficients, expected {expected})")


class CoefficientRangeError(ValueError):
    """``FastTokenizer.fit``: the quantized DCT coefficients span more integer values than FAST can represent.

    Each integer coefficient becomes one character ``chr(0x100 + c - min_coeff)``
    (``_fast_bpe.py``); the characters must stay below the UTF-16 surrogate block
    (U+D800), so at most ``limit`` distinct values (``max_coeff - min_coeff <=
    limit - 1``) fit. Subclass of ``ValueError``.

    Attributes:
        min_coeff, max_coeff: the integer coefficient range measured on the fitting chunks.
        limit: the largest number of distinct integer coefficients (``MAX_ALPHABET``).
        scale: the DCT scale that was asked for.
        max_scale: a scale at which every chunk of this horizon fits (normalized
            actions lie in [-1, 1], so ``|coefficient| <= sqrt(horizon)`` before scaling).
        horizon: the chunk length ``H`` of the fitting chunks.
        bound: ``round(sqrt(horizon) * scale)``, the theoretical largest ``|coefficient|`` for
            normalized actions in [-1, 1] (reached by a chunk constant at a bound, e.g. clipped).
    """

    def __init__(self, *, min_coeff: int, max_coeff: int, limit: int, scale: float, max_scale: float,
                 horizon: int) -> None:
        self.min_coeff, self.max_coeff, self.limit = min_coeff, max_coeff, limit
        self.scale, self.max_scale, self.horizon = scale, max_scale, horizon
        self.bound = round(horizon**0.5 * scale)
        got = max_coeff - min_coeff + 1
        at_bound = [f"{v}" for v in (min_coeff, max_coeff) if abs(v) >= self.bound]
        reached = (f"; {' and '.join(at_bound)} reach{'es' if len(at_bound) == 1 else ''} that bound: some chunk "
                   f"is constant at a normalization bound (e.g. clipped)" if at_bound else "")
        super().__init__(
            f"FAST coefficients at scale={scale:g}: the range measured on the fitting chunks is "
            f"{min_coeff}..{max_coeff} ({got} integer values), but the character alphabet holds at most {limit} "
            f"values (a coefficient range of {limit - 1}, i.e. {(limit - 1) / scale:.6g} in normalized DCT units "
            f"at this scale). The theoretical bound for actions normalized to [-1, 1] at horizon {horizon} is "
            f"-{self.bound}..{self.bound} (sqrt({horizon}) * scale){reached}; lower scale (scale <= "
            f"{max_scale:.6g} always fits this horizon)"
        )


class ReconstructionToleranceError(ValueError):
    """``FastTokenizer.fit(max_reconstruction_error=...)``: decode(encode(x)) is too far from x on the fitting data.

    Subclass of ``ValueError``.

    Attributes:
        dim: the first action dimension over the tolerance.
        max_abs: its largest absolute reconstruction error, action units.
        limit: the tolerance for that dimension, action units.
        bound_clip: the part of ``max_abs`` that clipping to the normalization bounds alone causes.
    """

    def __init__(self, *, dim: int, max_abs: float, limit: float, bound_clip: float, scale: float) -> None:
        self.dim, self.max_abs, self.limit, self.bound_clip = dim, max_abs, limit, bound_clip
        hint = (
            f"clipping to the normalization bounds alone gives {bound_clip:.6g} there: widen the bounds "
            f"(bounds='min_max')" if bound_clip > limit else f"raise scale (now {scale:g}) for a finer quantization"
        )
        super().__init__(
            f"FAST reconstruction error of action dimension {dim} is {max_abs:.6g} (max |decode(encode(x)) - x| on "
            f"the fitting chunks, action units), above max_reconstruction_error={limit:.6g}; {hint}"
        )
