"""Causal attention kernel pairs ``(forward with lse, backward given out and lse)`` for :mod:`._split_attention`.

CUDA: PyTorch's private SDPA ops, called the way its context-parallel ring
attention calls them (``torch/distributed/tensor/experimental/_context_parallel/
_attention.py``; schemas checked in torch 2.13, unchanged since 2.5):

- ``aten._scaled_dot_product_cudnn_attention(q, k, v, attn_bias, compute_log_sumexp,
  dropout_p, is_causal, return_debug_mask, *, scale)`` -> ``(out, lse, cum_seq_q,
  cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug_mask)``;
  ``..._cudnn_attention_backward(dout, q, k, v, out, lse, philox_seed, philox_offset,
  attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale)``.
- ``aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal,
  return_debug_mask, *, scale)`` (same outputs); ``..._flash_attention_backward(dout,
  q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
  philox_seed, philox_offset, *, scale)``.

Both return the natural-log log-sum-exp in float32; flash as ``(b, h, s)``, cuDNN as
``(b, h, s, 1)`` or ``(b, h, s)`` depending on the torch version, so the cuDNN
backward is handed the lse in the rank its own forward returned. With ``dropout_p =
0`` the philox tensors are not read: empty int64 scalars stand in for them. The
cuDNN pair is tried first (H200, torch 2.11: causal fwd+bwd ~500-540 TFLOP/s vs
flash ~280); where cuDNN raises (not built, unsupported shape) the call falls back
to flash, and that shape ``(head_dim, dtype, query length, key length)`` stays on flash
for the process (one warning per shape; other shapes still try cuDNN first).

CPU (and any device): a plain math pair that materializes the scores, computing
in ``promote_types(dtype, float32)`` (float64 in the tests).

Legend: ``b`` batch, ``h`` heads, ``q`` / ``k`` query / key positions, ``d`` head dim.
"""

from __future__ import annotations

import warnings

import torch

__all__ = ["cuda_kernels", "kernels_support", "math_kernels", "split_ops_available"]

_CUDNN_FAILED: set[tuple[int, torch.dtype, int, int]] = set()
_CUDNN_LSE_NDIM: dict[str, int] = {}


def split_ops_available() -> bool:
    """Whether this torch has the private cuDNN or flash SDPA forward/backward ops."""
    aten = torch.ops.aten
    return any(hasattr(aten, f"_scaled_dot_product_{name}_attention")
               and hasattr(aten, f"_scaled_dot_product_{name}_attention_backward") for name in ("cudnn", "flash"))


def kernels_support(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the default pair of ``q.device`` takes these tensors.

    CUDA: fp16 / bf16, v's head dim equal to q's, a multiple of 8 and at most 256. Other devices: always
    (the math pair).
    """
    if q.device.type != "cuda":
        return True
    head_dim = q.shape[-1]
    return (q.dtype in (torch.float16, torch.bfloat16) and v.shape[-1] == head_dim and head_dim % 8 == 0
            and head_dim <= 256)


# ---- math pair ---------------------------------------------------------------------------------------------

def _scores(q, k, causal, scale):
    acc = torch.promote_types(q.dtype, torch.float32)
    scores_bhqk = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * scale
    if causal:
        seq_q, seq_k = scores_bhqk.shape[-2:]
        upper = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu(1)
        scores_bhqk = scores_bhqk.masked_fill(upper, float("-inf"))
    return scores_bhqk


def _math_forward(q, k, v, causal, scale):
    scores_bhqk = _scores(q, k, causal, scale)
    lse_bhq = torch.logsumexp(scores_bhqk, dim=-1)
    out = torch.exp(scores_bhqk - lse_bhq[..., None]) @ v.to(scores_bhqk.dtype)
    return out.to(q.dtype), lse_bhq


def _math_backward(dout, q, k, v, out, lse, causal, scale):
    scores_bhqk = _scores(q, k, causal, scale)
    acc = scores_bhqk.dtype
    dout, out = dout.to(acc), out.to(acc)
    probs_bhqk = torch.exp(scores_bhqk - lse.to(acc)[..., None])
    dv = probs_bhqk.transpose(-1, -2) @ dout
    dprobs_bhqk = dout @ v.to(acc).transpose(-1, -2)
    delta_bhq1 = (dout * out).sum(-1, keepdim=True)
    dscores_bhqk = probs_bhqk * (dprobs_bhqk - delta_bhq1) * scale
    dq = dscores_bhqk @ k.to(acc)
    dk = dscores_bhqk.transpose(-1, -2) @ q.to(acc)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def math_kernels():
    """The plain-PyTorch pair ``(forward, backward)``: any device and dtype, O(seq^2) memory."""
    return _math_forward, _math_backward


# ---- CUDA pair ---------------------------------------------------------------------------------------------

def _philox(device):
    return torch.empty((), dtype=torch.long, device=device)


def _cudnn_forward(q, k, v, causal, scale):
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    out, lse = res[0], res[1]
    _CUDNN_LSE_NDIM["ndim"] = lse.dim()
    return out, lse.reshape(q.shape[:3])


def _cudnn_backward(dout, q, k, v, out, lse, causal, scale):
    lse = lse.float().contiguous()
    if _CUDNN_LSE_NDIM.get("ndim", 4) == 4:
        lse = lse.unsqueeze(-1)
    seq_q, seq_k = q.shape[2], k.shape[2]
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse, _philox(q.device), _philox(q.device), None, None, None, seq_q, seq_k, 0.0,
        causal, scale=scale,
    )[:3]


def _flash_forward(q, k, v, causal, scale):
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return res[0], res[1]


def _flash_backward(dout, q, k, v, out, lse, causal, scale):
    seq_q, seq_k = q.shape[2], k.shape[2]
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse.float().contiguous(), None, None, seq_q, seq_k, 0.0, causal, _philox(q.device),
        _philox(q.device), scale=scale,
    )[:3]


def _with_fallback(cudnn_fn, flash_fn):
    def call(*args):
        q, k = (args[1], args[2]) if len(args) == 8 else (args[0], args[1])
        key = (q.shape[-1], q.dtype, q.shape[2], k.shape[2])
        if key not in _CUDNN_FAILED and hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention"):
            try:
                return cudnn_fn(*args)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as err:
                _CUDNN_FAILED.add(key)
                warnings.warn(f"lf_kernels sdpa_split: cuDNN attention failed for head_dim={key[0]}, "
                              f"dtype={key[1]}, query/key length {key[2]}/{key[3]} ({str(err)[:200]}); using the "
                              "flash kernels for this shape", stacklevel=3)
        return flash_fn(*args)

    return call


def cuda_kernels():
    """The CUDA pair ``(forward, backward)``: cuDNN's causal kernels, flash where cuDNN fails (module docstring)."""
    return _with_fallback(_cudnn_forward, _flash_forward), _with_fallback(_cudnn_backward, _flash_backward)
