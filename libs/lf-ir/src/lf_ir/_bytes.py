"""Byte rules of the planner protocol: memory traffic of a forward and bytes kept for backward.

Legend: ``T = batch * seq`` tokens, ``d`` model width, ``kv = kv_heads * head_dim``,
``H`` MLP hidden width, ``h`` query heads, ``db`` bytes per activation element
(``dtype_bytes``: 4 float32, 2 bf16 / fp16). All results are bytes.

``saved_bytes`` is what PyTorch autograd (torch 2.11-2.13, CPU kernels, no
dropout) keeps alive for the backward of the lowered module, counted by storage
(a view and its base count once), parameters excluded, the node's input
included when its backward keeps it, its output only when the node itself
saves it. Derived op by op and checked against ``saved_tensors_hooks`` on the
lowered modules in float32 and bf16 (``tests/test_ir_bytes.py``):

- Linear / LMHead: the input (T*in). Conv patch embedding: the image.
- Embedding: the int64 ids (T*8). Learned positional table add: nothing.
- LayerNorm: input (T*d) and ``mean`` / ``rstd`` (T each), all in ``db``.
  RMSNorm (``nn.RMSNorm`` decomposes on CPU and upcasts to float32): the float32
  input, ``x * rstd`` (T*d each) and ``rstd`` (T), at ``max(db, 4)`` bytes; in bf16
  the bf16 input itself is not kept. On CUDA (``kernels="cuda"`` of :func:`norm_saved`)
  an RMSNorm whose weight has its input's dtype runs ``aten::_fused_rms_norm``, which
  keeps the input itself (T*d*db) and a float32 ``rstd`` (T*4): see :func:`fused_rms_norm_saved`.
- Attention, the shared input (T*d) of the q/k/v projections; RoPE cos and sin
  (batch*seq*head_dim each); then by ``lf_kernels.attention`` backend:
  flash (``full`` / ``causal`` or a mask equal to one, not packed, no key padding; SDPA's CPU flash
  kernel with ``enable_gqa``): q (T*d), k and v (T*kv each), the output
  (T*d, the output projection's input is a view of it) and the float32
  log-sum-exp (batch*h*seq*4). Dense mask (every other case): k and v
  expanded to h heads (T*d each) when GQA, the mask as a float tensor
  (mb*seq*seq, ``mb`` = batch with key padding or packed documents, else 1),
  the empty-row guard ``row_any`` (mb*seq) and a new output-projection input
  (T*d), besides q, the SDPA output and the log-sum-exp.
- MLP: its input; GELU: up output and GELU output (2*T*H); SwiGLU / GeGLU: gate and up
  outputs, ``silu(gate)`` / ``gelu_tanh(gate)`` and the product (4*T*H).
- Zero-centered RMSNorm (Gemma's ``(1 + w)``, op by op in float32): :func:`zero_centered_rms_saved`.
- Attention with ``kv_channels`` set: q, the SDPA output and the o projection's input are ``a = heads *
  head_dim`` wide instead of ``d`` (the rules below write ``d`` for the case ``a = d``).
- TransformerBlock: the sum of its four children (residual adds keep nothing).
- The multimodal, DiT and video VAE families: :mod:`lf_ir._bytes_video`.

``forward_bytes`` models eager, unfused kernels: every op reads its inputs and
writes its outputs once, parameters are read once, attention reads q, k, v
(and a dense mask as bool) and writes its output without materializing scores
(flash style). Shape-only ops (views, transposes) move nothing.
"""

from __future__ import annotations

LSE_BYTES = 4
"""SDPA's log-sum-exp is float32 for float16 / bfloat16 / float32 inputs."""


def check_sizes(node, batch: int, seq: int, dtype_bytes: int) -> None:
    """IRError (via the node) unless batch, seq and dtype_bytes are positive ints."""
    node._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)


KERNELS = ("cpu", "cuda")
"""Kernel paths a saved-bytes rule can describe: ``"cpu"`` (torch's CPU kernels, what lf-ir's byte tests
measure) or ``"cuda"`` (RMSNorm through torch's fused CUDA kernel; every other rule is the CPU one)."""

RSTD_BYTES = 4
"""Bytes per ``rstd`` element ``aten::_fused_rms_norm`` keeps: its accumulation type, float32 for float16 /
bfloat16 / float32 inputs."""


def fused_rms_norm_saved(tokens: int, dim: int, input_bytes: int) -> int:
    """Bytes ``torch.rms_norm`` keeps for backward on CUDA: the input and the per-row ``rstd``.

    ``at::native::rms_norm_symint`` calls ``aten::_fused_rms_norm`` when the weight has the
    input's dtype (else the composite path of :func:`norm_saved`'s CPU rule); its autograd node
    ``FusedRmsNormBackward0`` saves ``input``, ``weight`` and ``result1`` (``rstd``, shape
    ``(..., 1)``, float32 for float16 / bfloat16 / float32 inputs; torch 2.11-2.13,
    ``torch/csrc/autograd/generated/Functions.h``). No float32 copy of the input, no
    ``x * rstd``: the backward recomputes them.

    Args:
        tokens: rows normalized (``batch * seq``).
        dim: normalized feature size.
        input_bytes: bytes per element of the input as the kernel receives it (2 bf16 / fp16, 4 float32).

    Returns:
        ``tokens * dim * input_bytes + tokens * 4`` bytes. Not counted: the weight (a parameter, or
        under autocast :class:`lf_ir.RMSNormModule`'s ``dim``-element cast of it, ``dim * input_bytes``).

    Example:
        >>> fused_rms_norm_saved(65_520, 1536, 2)  # one Wan2.1 q norm, 2 x 32,760 tokens, bf16
        201539520
    """
    return tokens * dim * input_bytes + tokens * RSTD_BYTES


def norm_saved(kind: str, tokens: int, dim: int, dtype_bytes: int, *, kernels: str = "cpu") -> int:
    """Saved bytes of a LayerNorm (``kind="layer"``) or RMSNorm (``"rms"``) over ``tokens`` rows.

    Args:
        kind: ``"layer"`` or ``"rms"``.
        tokens: rows normalized (``batch * seq``).
        dim: normalized feature size.
        dtype_bytes: bytes per element of the norm's input.
        kernels: ``"cpu"``: torch's CPU path (LayerNorm: input, mean, rstd in ``dtype_bytes``;
            RMSNorm decomposed: float32 input, ``x * rstd`` and ``rstd``, ``(2 * tokens * dim + tokens)
            * max(dtype_bytes, 4)``); ``"cuda"``: RMSNorm through ``aten::_fused_rms_norm``
            (:func:`fused_rms_norm_saved`), LayerNorm as on the CPU.

    Returns:
        Bytes kept for backward, parameters excluded.

    Raises:
        ValueError: ``kernels`` not in :data:`KERNELS`.
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {list(KERNELS)}, got {kernels!r}")
    if kind == "layer":
        return (tokens * dim + 2 * tokens) * dtype_bytes
    if kernels == "cuda":
        return fused_rms_norm_saved(tokens, dim, dtype_bytes)
    return (2 * tokens * dim + tokens) * max(dtype_bytes, 4)


def zero_centered_rms_saved(tokens: int, dim: int, dtype_bytes: int, *, kernels: str = "cpu") -> int:
    """Saved bytes of a zero-centered RMSNorm (``Norm.zero_centered_gamma``, HF's ``GemmaRMSNorm`` op by op).

    In float32 (float64 for a float64 input): ``x.float()`` (kept by ``pow`` and the ``x * rstd`` product; a
    float32 input is itself), ``rstd`` (T, kept by ``rsqrt``), ``x * rstd`` and ``1 + weight`` (dim, both kept
    by the scale product). The same on every device (no fused kernel), so ``kernels`` is only checked.

    Returns:
        ``(2 * tokens * dim + tokens + dim) * max(dtype_bytes, 4)`` bytes (``dtype_bytes``: the input's).

    Raises:
        ValueError: ``kernels`` not in :data:`KERNELS`.
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {list(KERNELS)}, got {kernels!r}")
    return (2 * tokens * dim + tokens + dim) * max(dtype_bytes, 4)


def attention_flash_path(node, mask, seq: int, key_padding: bool) -> bool:
    """Whether ``lf_kernels.attention`` takes a mask-free SDPA path on the CPU (seq_q == seq_kv, no lse).

    The mask is first reduced to its simplest equivalent (``Mask.canonical``), as the dispatcher does.
    A bare ``"prefix_lm"`` (prefix length not recorded) is taken to have a prefix, so a dense mask.
    """
    if node.mask == "prefix_lm":
        return False
    return not key_padding and not mask.packed and mask.canonical(seq).kind in ("full", "causal")


def _inner(node) -> int:
    """Width of the queries and the attention output: ``heads * head_dim`` (``dim`` unless the head width is set)."""
    return node.heads * node.head_dim


def attention_saved(node, mask, batch: int, seq: int, dtype_bytes: int, key_padding: bool) -> int:
    """Saved bytes of an Attention node (see the module docstring)."""
    tokens, d, kv, a = batch * seq, node.dim, node.kv_heads * node.head_dim, _inner(node)
    elems = tokens * d + tokens * a + tokens * a  # input, q, SDPA output
    if node.rope is not None:
        elems += 2 * batch * seq * node.head_dim
    if attention_flash_path(node, mask, seq, key_padding):
        elems += 2 * tokens * kv
    else:
        mask_batch = batch if key_padding or mask.packed else 1
        elems += 2 * tokens * (a if node.heads != node.kv_heads else kv)
        elems += mask_batch * seq * seq + mask_batch * seq + tokens * a
    return elems * dtype_bytes + batch * node.heads * seq * LSE_BYTES


def attention_forward(node, mask, batch: int, seq: int, dtype_bytes: int, key_padding: bool) -> int:
    """Forward memory traffic of an Attention node (see the module docstring)."""
    tokens, d, kv, a = batch * seq, node.dim, node.kv_heads * node.head_dim, _inner(node)
    params = sum(_numel(s) for s in node.param_shapes().values())
    proj = 3 * tokens * d + tokens * (a + 2 * kv) + tokens * (a + d)  # q/k/v read x, write q/k/v; o in/out
    core = tokens * (a + 2 * kv) + tokens * a  # read q, k, v; write out
    rope = 0
    if node.rope is not None:
        rope = 2 * tokens * (a + kv) + 2 * batch * seq * node.head_dim
    mask_read = 0
    if not attention_flash_path(node, mask, seq, key_padding):
        mask_batch = batch if key_padding or mask.packed else 1
        mask_read = mask_batch * seq * seq  # bool, 1 byte per entry
    lse = batch * node.heads * seq * LSE_BYTES
    return (proj + core + rope + params) * dtype_bytes + mask_read + lse


def mlp_saved(node, tokens: int, dtype_bytes: int) -> int:
    """Saved bytes of an MLP node over ``tokens`` rows."""
    hidden_copies = 4 if node.gated else 2
    return (tokens * node.dim + hidden_copies * tokens * node.hidden) * dtype_bytes


def mlp_forward(node, tokens: int, dtype_bytes: int) -> int:
    """Forward traffic of an MLP node: the projections, the activation and (gated) the product."""
    d, hid = node.dim, node.hidden
    params = sum(_numel(s) for s in node.param_shapes().values())
    if node.gated:
        elems = 2 * tokens * (d + hid) + 2 * tokens * hid + 3 * tokens * hid + tokens * (hid + d)
    else:
        elems = tokens * (d + hid) + 2 * tokens * hid + tokens * (hid + d)
    return (elems + params) * dtype_bytes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def params_bytes(node, dtype_bytes: int) -> int:
    """Bytes of the node's own parameters at ``dtype_bytes`` per element."""
    return sum(_numel(s) for s in node.param_shapes().values()) * dtype_bytes
