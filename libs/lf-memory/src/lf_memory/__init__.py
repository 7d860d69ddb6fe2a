"""LoongForge memory: activation recomputation and the precision policy.

Public API:

- :func:`apply_activation_checkpointing`: recompute the activations of chosen
  blocks in backward, keeping ``state_dict`` keys unchanged.
- :class:`PrecisionPolicy`, :func:`resolve_precision`: float32 master weights
  with bf16 or fp32 compute, from the config's ``"auto" | "bf16" | "fp32"``.
"""

from ._precision import PRECISION_CHOICES, PrecisionPolicy, resolve_precision
from ._recompute import apply_activation_checkpointing

__all__ = [
    "PRECISION_CHOICES",
    "PrecisionPolicy",
    "apply_activation_checkpointing",
    "resolve_precision",
]

__version__ = "0.1.0"
