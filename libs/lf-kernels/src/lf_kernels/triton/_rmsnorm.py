"""Fused RMSNorm with an optional residual add (the pre-norm block), forward and backward.

Legend: ``n`` rows (all leading dims flattened), ``d`` hidden.
"""

from __future__ import annotations

import torch

from .._fused_reference import rms_norm_reference
from ._dispatch import FusedBackend, kernels, resolve_backend
from ._layout import as_rows, cdiv, next_pow2, unit_last
from ._partials import sum_partials

__all__ = ["rms_norm"]

_MAX_HIDDEN = 65536


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        weight = unit_last(weight)  # the kernels index it with a unit stride (a strided view would read wrong)
        x_nd = as_rows(x)
        n, d = x_nd.shape
        y_nd = torch.empty((n, d), dtype=x.dtype, device=x.device)
        rstd_n = torch.empty(n, dtype=torch.float32, device=x.device)
        has_res = residual is not None
        if has_res:
            r_nd = as_rows(residual)
            h_nd = torch.empty((n, d), dtype=residual.dtype, device=x.device)
        else:
            r_nd, h_nd = x_nd, x_nd
        if n:
            kernels("rmsnorm").rms_norm_fwd(next_pow2(d))[lambda meta: (cdiv(n, meta["BLOCK_R"]),)](
                x_nd, r_nd, weight, y_nd, h_nd, rstd_n, x_nd.stride(0), r_nd.stride(0), y_nd.stride(0),
                h_nd.stride(0), n, d, eps, HAS_RES=has_res, BLOCK_D=next_pow2(d),
            )
        ctx.save_for_backward(h_nd, weight, rstd_n)
        ctx.meta = (x.shape, x.dtype, has_res)
        y = y_nd.view(x.shape)
        if not has_res:
            return y
        return y, h_nd.view(x.shape)

    @staticmethod
    def backward(ctx, dy, dres=None):
        h_nd, weight, rstd_n = ctx.saved_tensors
        shape, x_dtype, has_res = ctx.meta
        n, d = h_nd.shape
        dy_nd = as_rows(dy)
        has_dres = has_res and dres is not None
        dres_nd = as_rows(dres) if has_dres else dy_nd
        dh_nd = torch.empty((n, d), dtype=h_nd.dtype, device=h_nd.device)
        tuning = kernels("tuning")
        block_d = next_pow2(d)
        programs, rows_per_program = tuning.persistent_split(
            n, tuning.sm_count(h_nd.device) * tuning.programs_per_sm(block_d))
        dw_part = torch.empty((programs, d), dtype=torch.float32, device=h_nd.device)
        if n:
            kernels("rmsnorm").rms_norm_bwd(block_d)[(programs,)](
                dy_nd, h_nd, weight, rstd_n, dres_nd, dh_nd, dw_part, dy_nd.stride(0), h_nd.stride(0),
                dres_nd.stride(0), dh_nd.stride(0), n, d, rows_per_program, HAS_DRES=has_dres, BLOCK_D=block_d,
            )
        dweight = torch.empty(d, dtype=weight.dtype, device=weight.device)
        sum_partials(dw_part.view(1, programs, d), dweight.view(1, d))
        dh = dh_nd.view(shape)
        dx = dh if dh.dtype == x_dtype else dh.to(x_dtype)
        return dx, dweight, (dh if has_res else None), None


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    *,
    backend: FusedBackend | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim (Zhang & Sennrich 2019, arXiv 1910.07467), optionally fused with a residual add.

    ``y = h * rsqrt(mean(h^2, -1) + eps) * weight`` with ``h = x``, or with
    ``residual`` ``h = x + residual`` (rounded to ``residual.dtype``), returned
    as the updated residual stream: ``y, h = rms_norm(x, w, eps, residual=h)``
    is one pre-norm block step. Statistics in float32; one read of each input
    and one write of each output.

    Args:
        x: ``(..., hidden)``, any float dtype, ``hidden <= 65536``.
        weight: ``(hidden,)``.
        eps: added to the mean square.
        residual: optional, same shape as ``x`` (its dtype may be wider, e.g. a float32 stream).
        backend: ``"triton"`` / ``"reference"`` to force one; default picks (see ``kernel_backend``).

    Returns:
        ``y`` in ``x.dtype``; with ``residual``, ``(y, h)`` with ``h`` in ``residual.dtype``.
        Gradients flow to ``x``, ``weight`` and ``residual``.

    Raises:
        ValueError: ``weight`` is not ``(hidden,)``, ``residual`` shape differs, or hidden too large.

    Example:
        >>> x, w = torch.randn(2, 5, 8), torch.ones(8)
        >>> y, h = rms_norm(x, w, 1e-6, residual=torch.zeros(2, 5, 8))
        >>> y.shape, torch.equal(h, x)
        (torch.Size([2, 5, 8]), True)
    """
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm: weight must have shape ({x.shape[-1]},) for x {tuple(x.shape)}, "
                         f"got {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"rms_norm: residual shape {tuple(residual.shape)} differs from x {tuple(x.shape)}")
    if resolve_backend("rms_norm", backend, x, weight, residual) == "reference":
        return rms_norm_reference(x, weight, eps, residual)
    if x.shape[-1] > _MAX_HIDDEN:
        raise ValueError(f"rms_norm: hidden {x.shape[-1]} exceeds the Triton kernel's {_MAX_HIDDEN}")
    return _RMSNormFn.apply(x, weight, residual, float(eps))
