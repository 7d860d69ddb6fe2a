"""Attention mask kinds of the IR, with their static parameters and exact kept fractions.

The same kinds and semantics as ``lf_kernels.MaskSpec`` (True = query ``i`` may
attend to key ``j``; ``seq_q == seq_kv``; positions ``0..seq-1``):

- ``"full"``: every pair (encoders, DiT, vision towers);
- ``"causal"``: ``j <= i`` (decoder LLMs);
- ``"prefix_lm"``: ``j <= i`` or ``j < prefix_len`` (PaLI / T5 prefix LM);
- ``"block_causal"``: ``j // frame_tokens <= i // frame_tokens`` (a token sees
  every token of its own and of earlier frames: causal video models);
- ``"window_3d"``: tokens laid out t-major on a ``grid = (T, H, W)``;
  ``|t_i - t_j| <= wt // 2`` and the same for h and w, ``window = (wt, wh, ww)``
  odd sizes (local 3D attention); ``causal_t=True`` also needs ``t_j <= t_i``;
- ``packed=True`` combines any kind with packed documents: attention also needs
  ``doc(i) == doc(j)`` (``MaskSpec.document_ids``; with ``causal`` this is the
  varlen case). Document lengths are data, so they are an argument of
  :meth:`Mask.kept_pairs`, not a field.

A node may carry the kind as a bare string for the kinds without parameters
(``"full"``, ``"causal"``, and ``"prefix_lm"`` for graphs written before the
prefix length was recorded: its prefix is then taken as 0, i.e. the causal
lower bound of the kept fraction).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Literal

import msgspec

__all__ = ["Mask", "MaskKind", "as_mask"]

MaskKind = Literal["full", "causal", "prefix_lm", "block_causal", "window_3d"]
_KINDS = ("full", "causal", "prefix_lm", "block_causal", "window_3d")
_STRING_KINDS = ("full", "causal", "prefix_lm")


class Mask(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An attention mask kind with its static parameters (see the module docstring).

    Example:
        >>> Mask(kind="block_causal", frame_tokens=4).keep_fraction(8)
        0.75
    """

    kind: MaskKind
    """Which pairs may attend: full, causal, prefix_lm, block_causal or window_3d."""
    prefix_len: int | None = None
    """prefix_lm only: leading tokens that attend bidirectionally."""
    frame_tokens: int | None = None
    """block_causal only: tokens per frame."""
    grid: tuple[int, int, int] | None = None
    """window_3d only: the (T, H, W) token grid, t-major; the sequence has T*H*W tokens."""
    window: tuple[int, int, int] | None = None
    """window_3d only: (wt, wh, ww) odd window sizes in tokens along t, h, w."""
    causal_t: bool = False
    """window_3d only: a token also sees no later frame (``t_j <= t_i``)."""
    packed: bool = False
    """Documents packed in one sequence: attention also stays within a document."""

    def problem(self) -> str | None:
        """Why these fields do not describe a mask (None if they do)."""
        if self.kind not in _KINDS:
            return f"unknown mask kind {self.kind!r}; expected one of {list(_KINDS)}"
        wanted = {"prefix_lm": {"prefix_len"}, "block_causal": {"frame_tokens"},
                  "window_3d": {"grid", "window"}}.get(self.kind, set())
        for key in ("prefix_len", "frame_tokens", "grid", "window"):
            value = getattr(self, key)
            if key in wanted and value is None:
                return f"mask kind {self.kind!r} needs {key}"
            if key not in wanted and value is not None:
                return f"{key} is only for mask kind(s) using it, got {key}={value!r} with kind {self.kind!r}"
        if self.causal_t and self.kind != "window_3d":
            return f"causal_t is only for mask kind 'window_3d', got it with kind {self.kind!r}"
        if self.prefix_len is not None and (not _is_int(self.prefix_len) or self.prefix_len < 0):
            return f"prefix_len must be an int >= 0, got {self.prefix_len!r}"
        if self.frame_tokens is not None and (not _is_int(self.frame_tokens) or self.frame_tokens <= 0):
            return f"frame_tokens must be a positive int, got {self.frame_tokens!r}"
        if self.grid is not None and not all(_is_int(g) and g > 0 for g in self.grid):
            return f"grid must be three positive ints (T, H, W), got {self.grid!r}"
        if self.window is not None and not all(_is_int(w) and w > 0 and w % 2 for w in self.window):
            return f"window must be three positive odd ints (wt, wh, ww), got {self.window!r}"
        return None

    def kept_pairs(self, seq: int, doc_lens: Sequence[int] | None = None) -> int:
        """Exact number of (query, key) pairs the mask keeps on one sample of ``seq`` tokens.

        Args:
            seq: tokens per sample (for window_3d it must be ``T * H * W``).
            doc_lens: packed only: the document lengths, summing to ``seq``;
                None counts the sample as one document (an upper bound).

        Raises:
            ValueError: ``seq`` not positive or not the grid size, ``doc_lens``
                without ``packed`` or not summing to ``seq``.
        """
        if not _is_int(seq) or seq <= 0:
            raise ValueError(f"seq must be a positive int, got {seq!r}")
        if self.kind == "window_3d" and seq != math.prod(self.grid):
            raise ValueError(f"window_3d: seq {seq} is not the grid size {'x'.join(map(str, self.grid))}")
        if doc_lens is None:
            bounds = [(0, seq)]
        else:
            if not self.packed:
                raise ValueError("doc_lens given for a mask that is not packed")
            if any(not _is_int(n) or n <= 0 for n in doc_lens) or sum(doc_lens) != seq:
                raise ValueError(f"doc_lens must be positive ints summing to seq={seq}, got {list(doc_lens)}")
            ends = list(itertools.accumulate(doc_lens))
            bounds = list(zip([0, *ends[:-1]], ends, strict=True))
        return sum(self._pairs_in(start, end) for start, end in bounds)

    def keep_fraction(self, seq: int, doc_lens: Sequence[int] | None = None) -> float:
        """Kept pairs over ``seq ** 2``, the fraction of the dense score matrix the mask keeps."""
        return self.kept_pairs(seq, doc_lens) / seq ** 2

    def _pairs_in(self, s: int, e: int) -> int:
        """Kept pairs with query and key both in positions [s, e) (global positions)."""
        n = e - s
        if self.kind == "full":
            return n * n
        if self.kind == "causal":
            return n * (n + 1) // 2
        if self.kind == "prefix_lm":
            m = max(0, min(e, self.prefix_len) - s)  # the document's positions inside the prefix
            return n * (n + 1) // 2 + m * (m - 1) // 2
        if self.kind == "block_causal":  # rows of frame f see keys s .. min(e, end of frame f) - 1
            f = self.frame_tokens
            return sum((min(e, (k + 1) * f) - max(s, k * f)) * (min(e, (k + 1) * f) - s)
                       for k in range(s // f, (e - 1) // f + 1))
        return self._window_pairs(s, e)

    def _window_pairs(self, s: int, e: int) -> int:
        (t, h, w), (wt, wh, ww) = self.grid, self.window
        if (s, e) == (0, t * h * w):  # the mask factorizes over the axes
            return (_axis_pairs(t, wt // 2, self.causal_t) * _axis_pairs(h, wh // 2, False)
                    * _axis_pairs(w, ww // 2, False))
        total = 0  # one document of a packed sequence: per query, key runs along w clipped to [s, e)
        for q in range(s, e):
            tq, hq, wq = q // (h * w), (q // w) % h, q % w
            w0, w1 = max(wq - ww // 2, 0), min(wq + ww // 2, w - 1)
            for tk in range(max(tq - wt // 2, 0), min(tq if self.causal_t else tq + wt // 2, t - 1) + 1):
                for hk in range(max(hq - wh // 2, 0), min(hq + wh // 2, h - 1) + 1):
                    base = (tk * h + hk) * w
                    total += max(min(base + w1, e - 1) - max(base + w0, s) + 1, 0)
        return total

    def canonical(self, seq: int) -> Mask:
        """The simplest kind with the same dense mask on ``seq`` tokens (as ``lf_kernels.canonical_mask``).

        block_causal with 1 token per frame or prefix_lm with an empty prefix are causal; one frame
        for everything, a prefix over everything or a non-causal window reaching across the grid are full.
        """
        kind, packed = self.kind, self.packed
        if (kind == "block_causal" and self.frame_tokens == 1) or (kind == "prefix_lm" and self.prefix_len == 0):
            return Mask(kind="causal", packed=packed)
        if ((kind == "block_causal" and self.frame_tokens >= seq) or (kind == "prefix_lm" and self.prefix_len >= seq)
                or (kind == "window_3d" and not self.causal_t
                    and all(k // 2 >= n - 1 for k, n in zip(self.window, self.grid, strict=True)))):
            return Mask(kind="full", packed=packed)
        return self


def _axis_pairs(n: int, r: int, one_sided: bool) -> int:
    """Pairs (i, j) in [0, n)^2 with |i - j| <= r (and j <= i when ``one_sided``)."""
    r = min(r, n - 1)
    near = r * n - r * (r + 1) // 2  # pairs with 1 <= i - j <= r
    return n + (1 if one_sided else 2) * near


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_mask(mask: str | Mask) -> Mask:
    """The :class:`Mask` of a node's ``mask`` field (bare strings get their parameter-free form).

    A bare ``"prefix_lm"`` (graphs written before the prefix length was kept) becomes
    ``Mask(kind="prefix_lm", prefix_len=0)``.

    Raises:
        ValueError: a bare string that is not full, causal or prefix_lm.
    """
    if isinstance(mask, Mask):
        return mask
    if mask not in _STRING_KINDS:
        if mask in _KINDS:
            raise ValueError(f"mask kind {mask!r} has parameters: give Mask(kind={mask!r}, ...)")
        raise ValueError(f"unknown mask kind {mask!r}; expected one of {list(_KINDS)}")
    return Mask(kind=mask, prefix_len=0 if mask == "prefix_lm" else None)
