"""Fused ops with Triton kernels and plain-PyTorch fallbacks (forward and backward).

Each op runs its Triton kernel on CUDA tensors (or CPU tensors under
``TRITON_INTERPRET=1``) and its reference from :mod:`lf_kernels._fused_reference`
elsewhere; :func:`kernel_backend` says which. Every kernel computes in float32
and writes the input dtype.

- :func:`rms_norm`: RMSNorm, optionally fused with the residual add of a pre-norm block.
- :func:`apply_rotary`: RoPE with per-token cos/sin tables (rotate half or interleaved);
  tables from :func:`rope_tables` (1D), :func:`mrope_tables` (Qwen2-VL M-RoPE),
  :func:`rope3d_tables` (Wan 3D), :func:`sectioned_rope_tables` (any split).
- :func:`swiglu`: ``silu(gate) * up``.
- :func:`modulate`: adaLN ``x * (1 + scale) + shift``, per sample / frame / token.
- :func:`fused_linear_cross_entropy`: LM head + cross-entropy (label smoothing, z-loss)
  chunked over tokens, never holding the full logits.
"""

from ._dispatch import FusedBackend, kernel_backend
from ._fused_ce import fused_linear_cross_entropy
from ._modulate import modulate
from ._rmsnorm import rms_norm
from ._rope import apply_rotary
from ._rope_tables import mrope_tables, rope3d_tables, rope_inv_freq, rope_tables, sectioned_rope_tables
from ._swiglu import swiglu

__all__ = [
    "FusedBackend",
    "apply_rotary",
    "fused_linear_cross_entropy",
    "kernel_backend",
    "modulate",
    "mrope_tables",
    "rms_norm",
    "rope3d_tables",
    "rope_inv_freq",
    "rope_tables",
    "sectioned_rope_tables",
    "swiglu",
]
