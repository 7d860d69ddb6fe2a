"""The token-chunk loop of fused linear cross-entropy: logits, per-row CE step, gradient GEMMs.

One sweep walks the tokens in chunks of ``chunk`` rows. Per chunk:
``logits_cv = h_ch @ W.T (+ b)`` into a reused buffer (float32 for bf16/fp16
inputs: ``torch.mm(..., out_dtype=float32)`` on CUDA, an upcast elsewhere), the
CE step (Triton ``ce_chunk`` or its torch twin) writes the per-row loss / lse
and, when gradients are wanted, ``g_cv = dloss/dlogits * scale`` in the input
dtype, then ``grad_h[chunk] = g_cv @ W`` (one GEMM, one rounding),
``grad_W += g_cv.T @ h_ch`` (``addmm`` into one preallocated accumulator) and
``grad_b += g_cv.sum(0)`` (float32). The forward of the grad-in-forward mode and
the backward of the recompute mode are both one sweep.

Legend: ``n`` tokens, ``h`` hidden, ``v`` vocab, ``c`` chunk rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._dispatch import kernels
from ._layout import next_pow2

__all__ = ["SweepConfig", "default_chunk", "logits_dtype", "sweep"]

_CHUNK_LOGIT_BYTES = 1 << 29  # float32 chunk logits stay <= 512 MiB (1,024 rows at vocab 128,256)


@dataclass(frozen=True)
class SweepConfig:
    """The options one sweep needs (all validated by the caller)."""

    ignore_index: int
    label_smoothing: float
    z_loss: float
    chunk: int
    use_triton: bool
    grad_weight_dtype: torch.dtype


def default_chunk(n_tokens: int, vocab: int) -> int:
    """Rows per chunk: float32 logits <= 512 MiB and at most a quarter of the tokens, a multiple of 128 when >= 128.

    Large chunks keep the three GEMMs efficient and the number of ``grad_W``
    read-modify-writes (``2 * v * h * 2`` bytes each) small; the quarter cap
    keeps the chunk buffers well under the memory of the materialized logits.
    """
    chunk = min(max(1, _CHUNK_LOGIT_BYTES // (4 * vocab)), -(-n_tokens // 4))
    if chunk >= 128:
        chunk -= chunk % 128
    return max(1, min(chunk, n_tokens))


@functools.cache
def _out_dtype_ops(device_type: str) -> tuple[bool, bool]:
    """Whether ``mm(out_dtype=float32)`` and ``addmm(fp32_acc, bf16, bf16, out_dtype=float32)`` run here."""
    if device_type != "cuda":
        return False, False
    a = torch.ones(2, 2, device=device_type, dtype=torch.bfloat16)
    acc = torch.zeros(2, 2, device=device_type)
    ok = []
    for op in (lambda: torch.mm(a, a.t(), out_dtype=torch.float32, out=acc),
               lambda: torch.addmm(acc, a.t(), a, out_dtype=torch.float32, out=acc)):
        try:
            op()
            ok.append(True)
        except (RuntimeError, NotImplementedError, TypeError):
            ok.append(False)
    return ok[0], ok[1]


def logits_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """float32 for bf16/fp16 inputs (CPU, or CUDA with ``mm(out_dtype=)``); the input dtype otherwise."""
    if dtype not in (torch.bfloat16, torch.float16):
        return dtype
    return torch.float32 if device.type == "cpu" or _out_dtype_ops(device.type)[0] else dtype


def _logits_into(out_cv, h_ch, weight, weight_up, bias):
    if out_cv.dtype == h_ch.dtype:
        if bias is None:
            torch.mm(h_ch, weight.t(), out=out_cv)
        else:
            torch.addmm(bias, h_ch, weight.t(), out=out_cv)
        return
    if weight_up is not None:  # no out_dtype matmul here (CPU): upcast, same maths
        torch.mm(h_ch.to(out_cv.dtype), weight_up.t(), out=out_cv)
    else:
        torch.mm(h_ch, weight.t(), out_dtype=out_cv.dtype, out=out_cv)
    if bias is not None:
        out_cv.add_(bias)


def _accumulate(acc_vh, g_vc, h_ch):
    """``acc += g @ h`` with the products summed in float32 (or wider) and ``acc`` rounded once per call."""
    if acc_vh.dtype == g_vc.dtype:
        acc_vh.addmm_(g_vc, h_ch)
    elif _out_dtype_ops(acc_vh.device.type)[1]:
        torch.addmm(acc_vh, g_vc, h_ch, out_dtype=acc_vh.dtype, out=acc_vh)
    else:
        acc_vh.addmm_(g_vc.to(acc_vh.dtype), h_ch.to(acc_vh.dtype))


def _ce_chunk_torch(logits_cv, grad_cv, target_c, loss_c, lse_c, scale_c, cfg, has_lse, write_loss, write_grad):
    """The torch twin of the Triton ``ce_chunk`` kernel (same maths, same in/out contract)."""
    x_cv = logits_cv.to(torch.promote_types(logits_cv.dtype, torch.float32))
    eps, z, vocab = cfg.label_smoothing, cfg.z_loss, x_cv.shape[1]
    valid_c = target_c != cfg.ignore_index
    safe_t = torch.where(valid_c, target_c, 0)[:, None]
    if has_lse:
        lse = lse_c.to(x_cv.dtype)
    else:
        lse = torch.logsumexp(x_cv, dim=-1)
        if write_loss:
            loss = lse - (1 - eps) * x_cv.gather(1, safe_t)[:, 0] - eps * x_cv.mean(-1) + z * lse.square()
            loss_c.copy_(torch.where(valid_c, loss, 0))
            lse_c.copy_(torch.where(valid_c, lse, 0))
    if write_grad:
        grad = torch.exp(x_cv - lse[:, None]) * (1 + 2 * z * lse)[:, None] - eps / vocab
        grad.scatter_add_(1, safe_t, torch.full_like(safe_t, -(1 - eps), dtype=grad.dtype))
        grad.masked_fill_(~valid_c[:, None], 0.0).mul_(scale_c.to(grad.dtype)[:, None])
        grad_cv.copy_(grad)


def _ce_chunk_triton(logits_cv, grad_cv, target_c, loss_c, lse_c, scale_c, cfg, has_lse, write_loss, write_grad):
    vocab = logits_cv.shape[1]
    block_v = min(next_pow2(vocab), 16384)
    warps = 16 if block_v >= 8192 else 8 if block_v >= 2048 else 4
    kernels("cross_entropy").ce_chunk[(logits_cv.shape[0],)](
        logits_cv, grad_cv, target_c, loss_c, lse_c, scale_c, logits_cv.stride(0), grad_cv.stride(0),
        scale_c.stride(0) if scale_c.numel() > 1 else 0, vocab, cfg.ignore_index, cfg.label_smoothing, cfg.z_loss,
        BLOCK_V=block_v, HAS_LSE=has_lse, WRITE_LOSS=write_loss, WRITE_GRAD=write_grad, num_warps=warps,
    )


def sweep(h_nh, weight, bias, t_n, cfg: SweepConfig, *, scale_n=None, lse_n=None, loss_n=None,
          need=(False, False, False)):
    """One pass over the token chunks; returns ``(grad_h, grad_w, grad_b)`` (``None`` where not needed).

    Args:
        h_nh: ``(n, h)`` hidden rows, unit column stride. weight: ``(v, h)``; bias: ``(v,)`` or ``None``.
        t_n: ``(n,)`` targets, already checked to lie in ``[0, v)`` or equal ``ignore_index``.
        scale_n: float ``(1,)`` (every row) or ``(n,)`` (per row) factor of the logits' gradient.
        lse_n: ``(n,)`` wide log-sum-exp: written when ``loss_n`` is given, else read (recompute backward).
        loss_n: ``(n,)`` wide per-token loss to write (0 on ignored rows), or ``None``.
        need: which of ``(grad_h, grad_w, grad_b)`` to compute; none means a loss-only sweep.

    ``grad_w`` comes back in ``cfg.grad_weight_dtype`` and ``grad_b`` in float32 (or wider).
    """
    n, vocab = h_nh.shape[0], weight.shape[0]
    chunk = max(1, min(cfg.chunk, n))
    dev, dtype = h_nh.device, h_nh.dtype
    write_grad, write_loss = any(need), loss_n is not None
    ldt = logits_dtype(dtype, dev)
    grad_h = torch.empty_like(h_nh, memory_format=torch.contiguous_format) if need[0] else None
    grad_w = torch.zeros(weight.shape, dtype=cfg.grad_weight_dtype, device=dev) if need[1] else None
    grad_b = torch.zeros(vocab, dtype=torch.promote_types(bias.dtype, torch.float32), device=dev) if need[2] else None
    logits_buf = torch.empty((chunk, vocab), dtype=ldt, device=dev)
    grad_buf = torch.empty((chunk, vocab), dtype=dtype, device=dev) if write_grad and ldt != dtype else logits_buf
    weight_up = weight.to(ldt) if ldt != dtype and not _out_dtype_ops(dev.type)[0] else None
    scale_n = scale_n if scale_n is not None else lse_n[:1]  # placeholder pointer when no gradient is written
    ce_chunk = _ce_chunk_triton if cfg.use_triton else _ce_chunk_torch
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        h_ch, logits_cv, grad_cv = h_nh[start:stop], logits_buf[: stop - start], grad_buf[: stop - start]
        _logits_into(logits_cv, h_ch, weight, weight_up, bias)
        scale_c = scale_n[start:stop] if scale_n.numel() > 1 else scale_n
        loss_c = loss_n[start:stop] if write_loss else lse_n[start:stop]
        ce_chunk(logits_cv, grad_cv, t_n[start:stop], loss_c, lse_n[start:stop], scale_c, cfg,
                 not write_loss, write_loss, write_grad)
        if grad_h is not None:
            torch.mm(grad_cv, weight, out=grad_h[start:stop])
        if grad_w is not None:
            _accumulate(grad_w, grad_cv.t(), h_ch)
        if grad_b is not None:
            grad_b += grad_cv.sum(0, dtype=grad_b.dtype)
    return grad_h, grad_w, grad_b
