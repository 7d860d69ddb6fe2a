"""Plain-PyTorch references of the fused ops (the oracles of the Triton kernels).

Each computes in float32 or wider (``promote_types(dtype, float32)``: float64
stays float64) and casts the result back to the input dtype, the same contract
as the kernels. They are also the CPU fallback of :mod:`lf_kernels.triton`, so
they are written for clarity first, but without Python loops over tokens.

Legend: ``b`` batch, ``h`` heads, ``s`` seq (tokens), ``d`` head dim / hidden,
``g`` modulation groups (per sample = 1, per frame = frames, per token = tokens),
``n`` flattened tokens, ``v`` vocabulary.
"""

from __future__ import annotations

import torch

__all__ = [
    "linear_cross_entropy_reference",
    "modulate_reference",
    "rms_norm_reference",
    "rotary_reference",
    "swiglu_reference",
]


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm ``y = h / sqrt(mean(h^2) + eps) * weight`` over the last dim (Zhang & Sennrich 2019).

    ``h = x`` or, with ``residual``, ``h = x + residual`` rounded to
    ``residual.dtype`` (the pre-norm block: the updated residual stream is
    returned too and the norm reads the rounded sum, as an unfused model does).

    Args:
        x: ``(..., hidden)``.
        weight: ``(hidden,)``.
        eps: added to the mean square.
        residual: optional, same shape as ``x``.

    Returns:
        ``y`` in ``x.dtype``, or ``(y, h)`` with ``h`` in ``residual.dtype``.
    """
    h = x if residual is None else (x.to(_wide(x.dtype)) + residual.to(_wide(residual.dtype))).to(residual.dtype)
    wide = _wide(h.dtype)
    hw = h.to(wide)
    y = hw * torch.rsqrt(hw.pow(2).mean(-1, keepdim=True) + eps) * weight.to(wide)
    return y.to(x.dtype) if residual is None else (y.to(x.dtype), h)


def rotary_reference(
    x_bhsd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False
) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864) with per-token tables.

    ``rotate half`` pairs (``i``, ``i + rot/2``), HF transformers' convention;
    ``interleaved`` pairs (``2i``, ``2i+1``), the complex-number form of GPT-J,
    Meta's original Llama and Wan. Features past ``rot = cos.shape[-1]`` pass
    through unchanged (partial rotary).

    Args:
        x_bhsd: ``(batch, heads, seq, head_dim)``.
        cos, sin: ``(batch | 1, seq, rot)`` or ``(seq, rot)``, ``rot`` even and ``<= head_dim``.

    Returns:
        ``(batch, heads, seq, head_dim)`` in ``x.dtype``.
    """
    wide = _wide(x_bhsd.dtype)
    rot = cos.shape[-1]
    cos_b1sr = (cos if cos.dim() == 3 else cos[None]).unsqueeze(1).to(wide)
    sin_b1sr = (sin if sin.dim() == 3 else sin[None]).unsqueeze(1).to(wide)
    x_rot, x_pass = x_bhsd[..., :rot].to(wide), x_bhsd[..., rot:]
    if interleaved:
        pairs = x_rot.unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        half = rot // 2
        rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    out = (x_rot * cos_b1sr + rotated * sin_b1sr).to(x_bhsd.dtype)
    return torch.cat((out, x_pass), dim=-1) if x_pass.shape[-1] else out


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU ``silu(gate) * up`` (Shazeer 2020, arXiv 2002.05202), result in ``gate.dtype``."""
    wide = _wide(gate.dtype)
    g = gate.to(wide)
    return (g * torch.sigmoid(g) * up.to(wide)).to(gate.dtype)


def modulation_groups(x_bsd: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> int:
    """Validate :func:`modulate` shapes; returns ``groups`` (modulation rows per sample).

    Raises:
        ValueError: ``x`` not 3-D, ``shift``/``scale`` shapes differ or are not
            ``(batch | 1, hidden)`` / ``(batch | 1, groups, hidden)``, or
            ``tokens % groups != 0``.
    """
    if x_bsd.dim() != 3:
        raise ValueError(f"modulate: x must be (batch, tokens, hidden), got shape {tuple(x_bsd.shape)}")
    if shift.shape != scale.shape:
        raise ValueError(f"modulate: shift and scale shapes differ: {tuple(shift.shape)} vs {tuple(scale.shape)}")
    batch, tokens, hidden = x_bsd.shape
    ok_rank = shift.dim() in (2, 3) and shift.shape[-1] == hidden and shift.shape[0] in (1, batch)
    groups = shift.shape[1] if shift.dim() == 3 else 1
    if not ok_rank or groups == 0 or tokens % groups != 0:
        raise ValueError(
            f"modulate: shift/scale must be (batch|1, hidden) or (batch|1, groups, hidden) with tokens % groups == 0 "
            f"for x of shape {tuple(x_bsd.shape)}, got {tuple(shift.shape)}"
        )
    return groups


def modulate_reference(x_bsd: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN modulation ``x * (1 + scale) + shift`` (DiT, Peebles & Xie 2023, arXiv 2212.09748).

    Args:
        x_bsd: ``(batch, tokens, hidden)``.
        shift, scale: ``(batch | 1, hidden)`` (per sample), or ``(batch | 1, groups, hidden)``:
            token ``t`` uses group ``t // (tokens // groups)`` (per frame when tokens are
            frame-major, per token when ``groups == tokens``).

    Returns:
        ``(batch, tokens, hidden)`` in ``x.dtype``.
    """
    groups = modulation_groups(x_bsd, shift, scale)
    wide = _wide(x_bsd.dtype)
    batch, tokens, hidden = x_bsd.shape
    x_bgtd = x_bsd.to(wide).reshape(batch, groups, tokens // groups, hidden)
    shift_bg1d = shift.to(wide).reshape(shift.shape[0], groups, 1, hidden)
    scale_bg1d = scale.to(wide).reshape(scale.shape[0], groups, 1, hidden)
    return (x_bgtd * (1 + scale_bg1d) + shift_bg1d).reshape(batch, tokens, hidden).to(x_bsd.dtype)


def linear_cross_entropy_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    reduction: str = "mean",
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` with label smoothing and z-loss; materializes the logits.

    Per token with target ``t != ignore_index``, logits ``x`` (vocab ``V``),
    ``lse = logsumexp(x)``::

        loss = (1 - eps) * (lse - x[t]) + eps * (lse - mean(x)) + z * lse**2

    (label smoothing as ``torch.nn.functional.cross_entropy``; z-loss as PaLM,
    Chowdhery et al. 2022, arXiv 2204.02311). ``reduction="mean"`` divides the
    sum by the number of non-ignored tokens, or by 1 if there are none (PyTorch
    would return NaN then); ``"none"`` returns the per-token losses (0 where ignored).

    Args:
        hidden: ``(..., hidden)``; weight: ``(vocab, hidden)``; target: ``(...)`` int64;
        bias: optional ``(vocab,)``.

    Returns:
        A scalar (``target.shape`` for ``"none"``) in float32 (float64 for float64 inputs).
    """
    wide = _wide(hidden.dtype)
    logits_nv = (hidden.reshape(-1, hidden.shape[-1]) @ weight.T).to(wide)
    if bias is not None:
        logits_nv = logits_nv + bias.to(wide)
    target_n = target.reshape(-1)
    valid_n = target_n != ignore_index
    safe_t = torch.where(valid_n, target_n, 0)
    lse_n = torch.logsumexp(logits_nv, dim=-1)
    nll_n = lse_n - logits_nv.gather(1, safe_t[:, None])[:, 0]
    smooth_n = lse_n - logits_nv.mean(-1)
    loss_n = (1 - label_smoothing) * nll_n + label_smoothing * smooth_n + z_loss * lse_n.square()
    if reduction == "none":
        return torch.where(valid_n, loss_n, 0).reshape(target.shape)
    total = torch.where(valid_n, loss_n, 0).sum()
    if reduction == "sum":
        return total
    return total / valid_n.sum().clamp(min=1)
