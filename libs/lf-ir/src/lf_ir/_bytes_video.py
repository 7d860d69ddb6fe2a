"""Byte rules of the video and multimodal node families (DiT, Wan VAE, Qwen2-VL ViT): saved bytes and traffic.

Same conventions as :mod:`lf_ir._bytes` (torch 2.11-2.13 CPU kernels, no dropout,
storages counted once, parameters excluded; ``db`` bytes per activation element,
``up = max(db, 4)`` for what the lowered modules compute in float32). Legend:
``T = batch * seq`` tokens (voxels for the VAE), ``d`` width / channels,
``H`` hidden width, ``h`` heads. Derived op by op from the lowered modules and
checked against ``saved_tensors_hooks`` (``tests/test_ir_bytes_families.py``):

- FeedForward: input (T*d), then GELU / tanh-GELU / SiLU keep their input and
  the down projection its input (2*T*H); quick-GELU ``x * sigmoid(1.702 x)``
  keeps x, the sigmoid output and the product (3*T*H).
- Float32 LayerNorm (DiT ``norm1/2/3``, head): the float32 input (T*d*4) and
  mean / rstd (T*4 each); an affine one in a non-float32 model also keeps the
  float32 copies of its weight and bias (2*d*4).
- ``nn.RMSNorm`` (DiT q/k norms): :func:`lf_ir._bytes.norm_saved` ``"rms"``; on CUDA
  (``kernels="cuda"``) the fused kernel's bf16 input and float32 rstd: the norms read the
  projections' outputs, in ``db`` under autocast, and :class:`lf_ir.RMSNormModule` casts its weight to match.
- Wan channel RMS norm: the (float32 when upcast) input (T*d*up), the L2 norm
  and its clamp (T*up each) and the normalized input scaled by sqrt(d) (T*d*db).
- Causal conv3d: its input stream, the input with ``kernel_t - 1`` zero (or
  cached) frames in front: ``batch * (frames + kernel_t - 1) * area * in * db``.
"""

from __future__ import annotations

import math

from lf_ir._bytes import LSE_BYTES, norm_saved


def ffn_saved(tokens: int, dim: int, hidden: int, activation: str, db: int) -> int:
    """Saved bytes of a two-matrix MLP with ``activation`` (see the module docstring)."""
    copies = 3 if activation == "quick_gelu" else 2
    return (tokens * dim + copies * tokens * hidden) * db


def ffn_forward(tokens: int, dim: int, hidden: int, activation: str, db: int, params: int) -> int:
    """Forward traffic of a two-matrix MLP: up, the activation's elementwise ops, down, parameters."""
    act = 7 * tokens * hidden if activation == "quick_gelu" else 2 * tokens * hidden  # quick: scale, sigmoid, mul
    return (tokens * (dim + hidden) + act + tokens * (hidden + dim) + params) * db


def fp32_layer_norm_saved(tokens: int, dim: int, db: int, affine: bool = False) -> int:
    """Saved bytes of a LayerNorm computed in float32 (diffusers' ``FP32LayerNorm``)."""
    weights = 2 * dim * 4 if affine and db != 4 else 0
    return tokens * dim * 4 + 2 * tokens * 4 + weights


def dit_attention_saved(node, batch: int, seq: int, db: int, kernels: str = "cpu") -> int:
    """Saved bytes of a :class:`~lf_ir._nodes_dit.DiTAttention`, caller-shared tensors excluded.

    The q projection's input (T*d), the q / k RMSNorms (``kernels``: see :func:`lf_ir._bytes.norm_saved`),
    q, k, v and the output as SDPA keeps them (k, v over the ``context_len`` text tokens for
    cross-attention), and the float32 log-sum-exp.
    """
    tokens, d = batch * seq, node.dim
    kv_tokens = batch * node.context_len if node.cross else tokens
    elems = 3 * tokens * d + 2 * kv_tokens * d  # input, q, out; k, v
    norms = norm_saved("rms", tokens, d, db, kernels=kernels) + norm_saved("rms", kv_tokens, d, db, kernels=kernels)
    return elems * db + norms + batch * node.heads * seq * LSE_BYTES


def dit_attention_forward(node, batch: int, seq: int, db: int, params: int) -> int:
    """Forward traffic of a DiTAttention: four projections, two RMSNorms, RoPE, flash-style core."""
    tokens, d = batch * seq, node.dim
    kv_tokens = batch * node.context_len if node.cross else tokens
    proj = tokens * 2 * d + 2 * kv_tokens * 2 * d + tokens * 2 * d  # q; k, v; o (read + write each)
    norms = 2 * tokens * d + 2 * kv_tokens * d
    rope = 4 * tokens * d if node.rope is not None else 0  # q and k read and written once more
    core = tokens * d + 2 * kv_tokens * d + tokens * d
    return (proj + norms + rope + core + params) * db + batch * node.heads * seq * LSE_BYTES


def dit_block_extra_saved(node, batch: int, seq: int, db: int) -> int:
    """What a DiTBlock keeps besides its attention and FFN children (see ``DiTBlock.saved_bytes``)."""
    tokens, d = batch * seq, node.dim
    modulation = batch * node.modulation.chunks * d * 4 + 2 * batch * d * 4  # gates' table; (1 + scale) x2
    norms = 2 * fp32_layer_norm_saved(tokens, d, db) + 2 * tokens * d * 4  # norm1, norm3 and their outputs
    if node.cross_attn_norm:
        norms += fp32_layer_norm_saved(tokens, d, db, affine=True)
    gated = tokens * d * db + tokens * d * 4  # attention output (db), FFN output as float32
    return modulation + norms + gated


def channel_norm_saved(tokens: int, dim: int, db: int) -> int:
    """Saved bytes of Wan's channel RMS norm over ``tokens`` voxels of ``dim`` channels."""
    up = max(db, 4)
    return tokens * dim * up + 2 * tokens * up + tokens * dim * db


def conv_stream_voxels(node, seq: int) -> int:
    """Voxels per sample of a causal conv's input stream: ``seq`` plus ``kernel_t - 1`` frames of padding.

    ``node.frames`` 0 (unknown) leaves the padding frames out.
    """
    if node.frames <= 0 or node.kernel[0] == 1:
        return seq
    if seq % node.frames:
        node._fail(f"seq {seq} (input voxels) is not a multiple of frames {node.frames}")
    return seq + (node.kernel[0] - 1) * (seq // node.frames)


def padded_area(area: int) -> int:
    """Pixels of a frame of ``area`` pixels padded by one row and one column (square frames assumed)."""
    side = math.isqrt(area)
    return area + 2 * side + 1
