"""Attention mask descriptions and their dense (materialized) form.

A :class:`MaskSpec` says *which* keys a query may attend to without building a
``(q_len, kv_len)`` tensor, so the IR, the data packer and context parallelism
can pass it around and split it; :func:`dense_mask` builds the boolean tensor
when a backend needs one, and :func:`mask_predicate` is the one element-wise
rule that both :func:`dense_mask` and the FlexAttention ``mask_mod`` evaluate
(so the two cannot drift apart).

Positions: with ``q_len != kv_len`` the queries are the *last* ``q_len``
positions of the key sequence (end alignment, as FlashAttention does for
decoding with a KV cache): query ``i`` sits at position ``kv_len - q_len + i``.
With ``q_len > kv_len`` the first ``q_len - kv_len`` queries sit at negative
positions and, for every kind but ``full``, see no key at all (attention
returns zeros for them).

Packed documents: ``document_ids`` ``(batch, kv_len)`` int combines with every
kind: a query attends to a key only if the kind allows it *and* both carry the
same id (with ``causal`` this is the "varlen" case of FlashAttention). It is an
argument next to ``key_padding``, not a ``MaskSpec`` field: it is per-batch
data, while a ``MaskSpec`` stays a small frozen, hashable description that the
IR stores and that keys compiled-kernel caches.

Legend: ``b`` batch, ``q`` query positions, ``k`` key positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["MaskKind", "MaskSpec", "check_mask_inputs", "dense_mask", "mask_predicate"]

MaskKind = Literal["full", "causal", "prefix_lm", "block_causal", "window_3d"]
_KINDS: tuple[str, ...] = ("full", "causal", "prefix_lm", "block_causal", "window_3d")
_FIELDS_OF_KIND = {
    "full": (), "causal": (), "prefix_lm": ("prefix_len",), "block_causal": ("frame_tokens",),
    "window_3d": ("grid", "window", "causal_t"),
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class MaskSpec:
    """Describes an attention mask without materializing it.

    Kinds (``True`` = may attend, positions end-aligned, see module docstring):

    - ``"full"``: every query sees every key (encoders, DiT, vision towers).
    - ``"causal"``: query at position ``p`` sees keys ``0..p`` (decoder LLMs).
    - ``"prefix_lm"``: the first ``prefix_len`` positions attend
      bidirectionally among themselves; a position ``p >= prefix_len`` sees the
      whole prefix and keys ``0..p`` causally (PaLI / T5 prefix LM, Raffel et
      al. 2020, sec. 3.2.1). ``prefix_len = 0`` equals ``"causal"``; a
      ``prefix_len >= kv_len`` equals ``"full"``.
    - ``"block_causal"``: tokens grouped in frames of ``frame_tokens``
      (``frame = position // frame_tokens``); position ``i`` sees ``j`` iff
      ``frame(j) <= frame(i)``: bidirectional within a frame, causal across
      frames (autoregressive video / VLA action chunks, e.g. CausVid). The last
      frame may be partial. ``frame_tokens = 1`` equals ``"causal"``.
    - ``"window_3d"``: tokens laid out t-major on ``grid = (T, H, W)``
      (``position = (t * H + h) * W + w``, ``T * H * W == kv_len``); ``i`` sees
      ``j`` iff ``|t_i - t_j| <= wt // 2`` and ``|h_i - h_j| <= wh // 2`` and
      ``|w_i - w_j| <= ww // 2`` for ``window = (wt, wh, ww)``, odd sizes
      (sliding-tile / neighbourhood attention for video DiTs); with
      ``causal_t=True`` additionally ``t_j <= t_i``.

    Raises:
        ValueError: unknown ``kind``; a field the kind needs missing, of the
            wrong type or out of range (``prefix_len >= 0``, ``frame_tokens >=
            1``, ``grid`` three ints >= 1, ``window`` three odd ints >= 1); a
            field given that the kind does not use. Messages name
            ``MaskSpec.<field>`` and the value received.

    Example:
        >>> MaskSpec("prefix_lm", prefix_len=3).prefix_len
        3
        >>> MaskSpec("window_3d", grid=(21, 30, 52), window=(3, 9, 9)).kind
        'window_3d'
    """

    kind: MaskKind
    """One of ``"full"``, ``"causal"``, ``"prefix_lm"``, ``"block_causal"``, ``"window_3d"``."""
    prefix_len: int | None = None
    """``prefix_lm`` only: number of leading positions that attend bidirectionally."""
    frame_tokens: int | None = None
    """``block_causal`` only: tokens per frame (>= 1)."""
    grid: tuple[int, int, int] | None = None
    """``window_3d`` only: ``(T, H, W)`` token layout, t-major; ``T * H * W`` must equal ``kv_len``."""
    window: tuple[int, int, int] | None = None
    """``window_3d`` only: ``(wt, wh, ww)`` odd window sizes in tokens along t, h, w."""
    causal_t: bool = False
    """``window_3d`` only: also forbid keys from later frames (``t_j > t_i``)."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"MaskSpec.kind must be one of {list(_KINDS)}, got {self.kind!r}")
        used = _FIELDS_OF_KIND[self.kind]
        for name in ("prefix_len", "frame_tokens", "grid", "window", "causal_t"):
            value = getattr(self, name)
            unset = value is False if name == "causal_t" else value is None
            if name not in used and not unset:
                raise ValueError(
                    f"MaskSpec.{name} is only allowed for kind={_kind_of(name)!r}, "
                    f"got {name}={value!r} with kind={self.kind!r}"
                )
        if self.kind == "prefix_lm":
            self._check_int("prefix_len", 0)
        elif self.kind == "block_causal":
            self._check_int("frame_tokens", 1)
        elif self.kind == "window_3d":
            for name in ("grid", "window"):
                value = getattr(self, name)
                if not isinstance(value, tuple) or len(value) != 3 or not all(_is_int(x) and x >= 1 for x in value):
                    raise ValueError(f"MaskSpec.{name} must be a tuple of three ints >= 1, got {value!r}")
            if any(x % 2 == 0 for x in self.window):
                raise ValueError(f"MaskSpec.window sizes must be odd (centred windows), got {self.window!r}")
            if not isinstance(self.causal_t, bool):
                raise ValueError(f"MaskSpec.causal_t must be a bool, got {self.causal_t!r}")

    def _check_int(self, name: str, minimum: int) -> None:
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"MaskSpec.{name} is required for kind={self.kind!r}, got None")
        if not _is_int(value):
            raise ValueError(f"MaskSpec.{name} must be an int, got {value!r}")
        if value < minimum:
            raise ValueError(f"MaskSpec.{name} must be >= {minimum}, got {value}")


def _kind_of(field_name: str) -> str:
    return next(kind for kind, fields in _FIELDS_OF_KIND.items() if field_name in fields)


def mask_predicate(spec: MaskSpec, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Element-wise "may attend" rule of ``spec`` (documents and padding excluded).

    Args:
        spec: the mask description.
        q_pos: int tensor of query *positions* (already end-aligned, may be negative).
        k_pos: int tensor of key positions, broadcastable against ``q_pos``.

    Returns:
        bool tensor of the broadcast shape. Uses only element-wise integer ops,
        so it also serves as a FlexAttention ``mask_mod`` body.
    """
    kind = spec.kind
    if kind == "full":
        return (k_pos >= 0) | (q_pos < 0)  # all True, broadcast to both shapes
    if kind == "causal":
        return k_pos <= q_pos
    if kind == "prefix_lm":
        # Negative query positions do not exist in the sequence: no key at all.
        return (k_pos <= q_pos) | ((k_pos < spec.prefix_len) & (q_pos >= 0))
    if kind == "block_causal":
        # Floor division: a negative position lands in a negative frame and sees nothing.
        return (k_pos // spec.frame_tokens) <= (q_pos // spec.frame_tokens)
    _, h_size, w_size = spec.grid
    rt, rh, rw = (x // 2 for x in spec.window)
    hw = h_size * w_size
    tq, hq, wq = q_pos // hw, (q_pos // w_size) % h_size, q_pos % w_size
    tk, hk, wk = k_pos // hw, (k_pos // w_size) % h_size, k_pos % w_size
    keep = ((tq - tk).abs() <= rt) & ((hq - hk).abs() <= rh) & ((wq - wk).abs() <= rw) & (q_pos >= 0)
    if spec.causal_t:
        keep = keep & (tk <= tq)
    return keep


def _check_len(name: str, value: int) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def check_mask_inputs(
    spec: MaskSpec,
    q_len: int,
    kv_len: int,
    key_padding: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> None:
    """Validate a mask request (shared by :func:`dense_mask` and the attention backends).

    Raises:
        TypeError: ``spec`` is not a :class:`MaskSpec`.
        ValueError: negative lengths; ``window_3d`` grid not covering ``kv_len``;
            ``key_padding`` not bool ``(batch, kv_len)``; ``document_ids`` not an
            integer ``(batch, kv_len)`` tensor, its batch differing from
            ``key_padding``'s, or given with ``q_len > kv_len``.
    """
    if not isinstance(spec, MaskSpec):
        raise TypeError(f"mask must be a MaskSpec, got {type(spec).__name__}")
    _check_len("q_len", q_len)
    _check_len("kv_len", kv_len)
    if spec.kind == "window_3d":
        t_size, h_size, w_size = spec.grid
        if t_size * h_size * w_size != kv_len:
            raise ValueError(
                f"MaskSpec.grid={spec.grid} holds {t_size * h_size * w_size} tokens, but kv_len={kv_len}"
            )
    if key_padding is not None:
        if key_padding.dtype != torch.bool:
            raise ValueError(f"key_padding must be a bool tensor, got dtype {key_padding.dtype}")
        if key_padding.ndim != 2 or key_padding.shape[1] != kv_len:
            raise ValueError(
                f"key_padding must have shape (batch, kv_len={kv_len}), got {tuple(key_padding.shape)}"
            )
    if document_ids is not None:
        if document_ids.dtype.is_floating_point or document_ids.dtype.is_complex or document_ids.dtype == torch.bool:
            raise ValueError(f"document_ids must be an integer tensor, got dtype {document_ids.dtype}")
        if document_ids.ndim != 2 or document_ids.shape[1] != kv_len:
            raise ValueError(
                f"document_ids must have shape (batch, kv_len={kv_len}), got {tuple(document_ids.shape)}"
            )
        if key_padding is not None and key_padding.shape[0] != document_ids.shape[0]:
            raise ValueError(
                f"document_ids batch {document_ids.shape[0]} differs from key_padding batch {key_padding.shape[0]}"
            )
        if q_len > kv_len:
            raise ValueError(f"document_ids needs q_len <= kv_len (queries are the last keys), got {q_len} > {kv_len}")


def dense_mask(
    spec: MaskSpec,
    q_len: int,
    kv_len: int,
    *,
    key_padding: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Materialize ``spec`` as a boolean tensor, ``True`` = may attend.

    Args:
        spec: the mask description.
        q_len: number of query positions (the last ``q_len`` of the sequence).
        kv_len: number of key positions.
        key_padding: optional ``(batch, kv_len)`` bool, ``True`` = real token,
            ``False`` = padding that no query may attend to.
        document_ids: optional ``(batch, kv_len)`` integer document id per
            position (packed sequences); query ``i`` (position ``p``) may only
            attend to keys with ``document_ids[b, p]``.
        device: device of the result; defaults to ``key_padding``'s or
            ``document_ids``'s device, else CPU.

    Returns:
        bool tensor ``(1, 1, q_len, kv_len)`` without ``key_padding`` and
        ``document_ids``, else ``(batch, 1, q_len, kv_len)``; broadcastable over heads.

    Raises:
        ValueError, TypeError: see :func:`check_mask_inputs`.

    Example:
        >>> dense_mask(MaskSpec("causal"), 2, 3)[0, 0].tolist()
        [[True, True, False], [True, True, True]]
        >>> dense_mask(MaskSpec("block_causal", frame_tokens=2), 3, 3)[0, 0].int().tolist()
        [[1, 1, 0], [1, 1, 0], [1, 1, 1]]
    """
    check_mask_inputs(spec, q_len, kv_len, key_padding, document_ids)
    for tensor in (key_padding, document_ids):
        if device is None and tensor is not None:
            device = tensor.device
    q_pos = torch.arange(q_len, device=device) + (kv_len - q_len)
    k_pos = torch.arange(kv_len, device=device)
    mask_qk = mask_predicate(spec, q_pos[:, None], k_pos[None, :])
    mask_bhqk = mask_qk[None, None]
    if key_padding is not None:
        mask_bhqk = mask_bhqk & key_padding.to(device)[:, None, None, :]
    if document_ids is not None:
        doc_bk = document_ids.to(device)
        doc_bq = doc_bk[:, kv_len - q_len:]
        mask_bhqk = mask_bhqk & (doc_bq[:, None, :, None] == doc_bk[:, None, None, :])
    return mask_bhqk
