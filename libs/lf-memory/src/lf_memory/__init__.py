"""LoongForge memory: activation recomputation, saved-activation prediction, precision.

Public API:

- :func:`apply_recompute`: the recompute modes ``none | full | selective |
  every_k`` on a model's blocks; :func:`apply_activation_checkpointing`: full
  recompute on chosen blocks. Both keep ``state_dict`` keys unchanged.
- :func:`block_saved_bytes`, :func:`stack_saved_bytes`: bytes kept for backward
  predicted from the lf-ir graph; :func:`measure_saved_bytes` measures them.
- :class:`PrecisionPolicy`, :func:`resolve_precision`: float32 master weights
  with bf16 or fp32 compute; :class:`DynamicLossScaler`: fp16 loss scaling.
- :func:`token_normalized_loss`, :func:`global_token_count`: gradient
  accumulation over micro-batches and ranks equal to one large batch.
"""

from ._accumulate import global_token_count, token_normalized_loss
from ._loss_scale import DynamicLossScaler
from ._measure import measure_saved_bytes
from ._precision import PRECISION_CHOICES, PrecisionPolicy, resolve_precision
from ._recompute import apply_activation_checkpointing
from ._recompute_modes import RECOMPUTE_MODES, SAC_SAVE_OPS, apply_recompute, recompute_flags
from ._saved_bytes import block_saved_bytes, block_saved_terms, stack_saved_bytes

__all__ = [
    "PRECISION_CHOICES",
    "RECOMPUTE_MODES",
    "SAC_SAVE_OPS",
    "DynamicLossScaler",
    "PrecisionPolicy",
    "apply_activation_checkpointing",
    "apply_recompute",
    "block_saved_bytes",
    "block_saved_terms",
    "global_token_count",
    "measure_saved_bytes",
    "recompute_flags",
    "resolve_precision",
    "stack_saved_bytes",
    "token_normalized_loss",
]

__version__ = "0.2.0"
