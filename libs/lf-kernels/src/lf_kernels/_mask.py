"""Attention mask descriptions and their dense (materialized) form.

A :class:`MaskSpec` says *which* keys a query may attend to without building a
``(q_len, kv_len)`` tensor, so the IR, the data packer and context parallelism
can pass it around and split it; :func:`dense_mask` builds the boolean tensor
when a backend needs one.

Positions: with ``q_len != kv_len`` the queries are the *last* ``q_len``
positions of the key sequence (end alignment, as FlashAttention does for
decoding with a KV cache): query ``i`` sits at position ``kv_len - q_len + i``.
With ``q_len > kv_len`` the first ``q_len - kv_len`` queries sit at negative
positions and, for ``causal`` and ``prefix_lm``, see no key at all (attention
returns zeros for them).

Legend: ``b`` batch, ``q`` query positions, ``k`` key positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["MaskKind", "MaskSpec", "dense_mask"]

MaskKind = Literal["full", "causal", "prefix_lm"]
_KINDS: tuple[str, ...] = ("full", "causal", "prefix_lm")


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

    Raises:
        ValueError: unknown ``kind``; ``prefix_len`` missing, not an int or
            negative for ``"prefix_lm"``; ``prefix_len`` given for another kind.

    Example:
        >>> MaskSpec("prefix_lm", prefix_len=3)
        MaskSpec(kind='prefix_lm', prefix_len=3)
    """

    kind: MaskKind
    """One of ``"full"``, ``"causal"``, ``"prefix_lm"``."""
    prefix_len: int | None = None
    """``prefix_lm`` only: number of leading positions that attend bidirectionally."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"MaskSpec.kind must be one of {list(_KINDS)}, got {self.kind!r}")
        if self.kind == "prefix_lm":
            if self.prefix_len is None:
                raise ValueError("MaskSpec.prefix_len is required for kind='prefix_lm', got None")
            if isinstance(self.prefix_len, bool) or not isinstance(self.prefix_len, int):
                raise ValueError(f"MaskSpec.prefix_len must be an int, got {self.prefix_len!r}")
            if self.prefix_len < 0:
                raise ValueError(f"MaskSpec.prefix_len must be >= 0, got {self.prefix_len}")
        elif self.prefix_len is not None:
            raise ValueError(
                f"MaskSpec.prefix_len is only allowed for kind='prefix_lm', "
                f"got prefix_len={self.prefix_len!r} with kind={self.kind!r}"
            )


def _check_len(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def dense_mask(
    spec: MaskSpec,
    q_len: int,
    kv_len: int,
    *,
    key_padding: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Materialize ``spec`` as a boolean tensor, ``True`` = may attend.

    Args:
        spec: the mask description.
        q_len: number of query positions (the last ``q_len`` of the sequence).
        kv_len: number of key positions.
        key_padding: optional ``(batch, kv_len)`` bool, ``True`` = real token,
            ``False`` = padding that no query may attend to.
        device: device of the result; defaults to ``key_padding``'s device, else CPU.

    Returns:
        bool tensor ``(1, 1, q_len, kv_len)`` without ``key_padding``, or
        ``(batch, 1, q_len, kv_len)`` with it; broadcastable over heads.

    Raises:
        ValueError: negative lengths; ``key_padding`` not bool or not ``(batch, kv_len)``.
        TypeError: ``spec`` is not a :class:`MaskSpec`.

    Example:
        >>> dense_mask(MaskSpec("causal"), 2, 3)[0, 0].tolist()
        [[True, True, False], [True, True, True]]
    """
    if not isinstance(spec, MaskSpec):
        raise TypeError(f"spec must be a MaskSpec, got {type(spec).__name__}")
    _check_len("q_len", q_len)
    _check_len("kv_len", kv_len)
    if key_padding is not None:
        if key_padding.dtype != torch.bool:
            raise ValueError(f"key_padding must be a bool tensor, got dtype {key_padding.dtype}")
        if key_padding.ndim != 2 or key_padding.shape[1] != kv_len:
            raise ValueError(
                f"key_padding must have shape (batch, kv_len={kv_len}), got {tuple(key_padding.shape)}"
            )
        if device is None:
            device = key_padding.device
    q_pos = torch.arange(q_len, device=device) + (kv_len - q_len)
    k_pos = torch.arange(kv_len, device=device)
    if spec.kind == "full":
        mask_qk = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    else:
        mask_qk = k_pos[None, :] <= q_pos[:, None]
        if spec.kind == "prefix_lm":
            # Queries at negative positions (q_len > kv_len) do not exist in the
            # sequence: they stay fully masked, as in "causal".
            in_seq = (q_pos >= 0)[:, None]
            mask_qk = mask_qk | ((k_pos < spec.prefix_len)[None, :] & in_seq)
    mask_bhqk = mask_qk[None, None]
    if key_padding is not None:
        mask_bhqk = mask_bhqk & key_padding.to(device)[:, None, None, :]
    return mask_bhqk
