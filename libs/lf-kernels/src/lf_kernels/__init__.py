"""LoongForge kernels: attention with the masks video and VLA need, fused ops, causal conv3d.

Public API:

- :class:`MaskSpec`: a mask kind (``full`` / ``causal`` / ``prefix_lm`` / ``block_causal`` /
  ``window_3d``) without a tensor; packed documents come as ``document_ids`` arguments.
- :func:`dense_mask`, :func:`mask_predicate`: the bool mask of a spec (the one rule every
  backend follows); :func:`keep_fraction`, :func:`kept_entries`: its exact density.
- :func:`attention`: scaled dot-product attention with GQA, key padding, packed
  documents and optional log-sum-exp, dispatched by :func:`choose_backend` to SDPA
  (cuDNN / flash), flash-attn varlen, FlexAttention or a chunked math path with a backward.
- :func:`attention_reference`: the plain-PyTorch oracle used by the tests;
  :func:`attention_math`: the explicit math path on a given bool mask (context parallel uses it).
- Fused ops (Triton on CUDA or under ``TRITON_INTERPRET=1``, PyTorch reference otherwise):
  :func:`rms_norm`, :func:`apply_rotary` (+ table builders), :func:`swiglu`, :func:`modulate`,
  :func:`fused_linear_cross_entropy`; :func:`kernel_backend` says which runs.
- :func:`causal_conv3d` / :class:`CausalConv3d`: Wan VAE's time-causal 3D convolution with
  the per-chunk feature cache (channels-last-3d on CUDA).
"""

from ._attention import attention, select_backend
from ._dispatch import Backend, canonical_mask, choose_backend
from ._fused_reference import (
    linear_cross_entropy_reference,
    modulate_reference,
    rms_norm_reference,
    rotary_reference,
    swiglu_reference,
)
from ._keep import keep_fraction, kept_entries
from ._mask import MaskKind, MaskSpec, dense_mask, mask_predicate
from ._math import attention_math
from ._reference import attention_reference
from ._split_attention import CausalKernels, attention_split
from ._split_attention import default_kernels as attention_kernels
from ._split_attention import kernels_support as attention_kernels_support
from .conv3d import CausalConv3d, causal_conv3d
from .triton import (
    FusedBackend,
    apply_rotary,
    fused_linear_cross_entropy,
    kernel_backend,
    modulate,
    mrope_tables,
    rms_norm,
    rope3d_tables,
    rope_tables,
    sectioned_rope_tables,
    swiglu,
)

__all__ = [
    "CausalKernels",
    "attention_kernels",
    "attention_kernels_support",
    "attention_split",
    "Backend",
    "CausalConv3d",
    "FusedBackend",
    "MaskKind",
    "MaskSpec",
    "apply_rotary",
    "attention",
    "attention_math",
    "attention_reference",
    "canonical_mask",
    "causal_conv3d",
    "choose_backend",
    "dense_mask",
    "fused_linear_cross_entropy",
    "keep_fraction",
    "kept_entries",
    "kernel_backend",
    "linear_cross_entropy_reference",
    "mask_predicate",
    "modulate",
    "modulate_reference",
    "mrope_tables",
    "rms_norm",
    "rms_norm_reference",
    "rope3d_tables",
    "rope_tables",
    "rotary_reference",
    "sectioned_rope_tables",
    "select_backend",
    "swiglu",
    "swiglu_reference",
]

__version__ = "0.5.2"
