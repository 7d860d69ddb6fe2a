"""LoongForge kernels: attention with mask descriptions.

Public API:

- :class:`MaskSpec`: a mask kind (``full`` / ``causal`` / ``prefix_lm``) without a tensor.
- :func:`dense_mask`: the bool ``(batch|1, 1, q_len, kv_len)`` tensor of a ``MaskSpec``.
- :func:`attention`: scaled dot-product attention with GQA, key padding and
  optional log-sum-exp; picks SDPA or an explicit math path per case.
- :func:`attention_reference`: the plain-PyTorch oracle used by the tests.
- :func:`select_backend`: which backend :func:`attention` takes for a case.
"""

from ._attention import Backend, attention, select_backend
from ._mask import MaskKind, MaskSpec, dense_mask
from ._reference import attention_reference

__all__ = [
    "Backend",
    "MaskKind",
    "MaskSpec",
    "attention",
    "attention_reference",
    "dense_mask",
    "select_backend",
]

__version__ = "0.1.0"
