"""LoongForge memory: activation recomputation, saved-activation prediction, precision.

Public API:

- :func:`apply_recompute`: the recompute modes ``none | full | selective |
  every_k`` on a model's blocks; :func:`apply_activation_checkpointing`: full
  recompute on chosen blocks. Both keep ``state_dict`` keys unchanged.
- :func:`block_saved_bytes`, :func:`stack_saved_bytes`: bytes kept for backward
  predicted from the lf-ir graph; :func:`measure_saved_bytes` measures them.
- :class:`PrecisionPolicy`, :func:`resolve_precision`: float32 master weights
  with bf16 or fp32 compute; :class:`DynamicLossScaler`: fp16 loss scaling.
- :func:`plan_recompute`: the exact knapsack over blocks x recompute options with the
  least recomputed FLOPs under a memory budget (``memory.recompute = "auto"``);
  :func:`offload_activations`: saved activations to pinned CPU memory;
  :func:`apply_fp8`: torchao float8 training on the linears a GEMM-shape filter picks.
- :func:`estimate_memory`: params, grads, optimizer state, activations, temporaries and
  communication buffers per rank for any parallel plan (``lf memory``); :func:`residual_stream_bytes`: the
  bytes per element of the residual stream the norms read under a plan.
- :func:`graph_view` / :class:`GraphView`: an lf-ir graph's blocks and trunk as the estimator and the
  pipeline splitter see them; :func:`trunk_name`: the trunk (main) component of a graph.
- :func:`token_normalized_loss`, :func:`global_token_count`: gradient
  accumulation over micro-batches and ranks equal to one large batch.
"""

from ._accumulate import global_token_count, token_normalized_loss
from ._block_rules import BlockProfile, register_block_rule
from ._estimate import MemoryEstimate, estimate_memory, in_flight_micro_batches, residual_stream_bytes
from ._estimate_graph import GraphView, graph_view, trunk_name
from ._fp8 import FP8_RECIPES, apply_fp8, fp8_filter, fp8_linear_names, fp8_supported
from ._loss_scale import DynamicLossScaler
from ._measure import measure_saved_bytes
from ._offload import offload_activations
from ._planner import BLOCK_OPTIONS, RecomputePlan, block_option_costs, plan_recompute, solve_recompute
from ._precision import PRECISION_CHOICES, PrecisionPolicy, resolve_precision
from ._recompute import apply_activation_checkpointing
from ._recompute_modes import RECOMPUTE_MODES, SAC_MATMUL_OPS, SAC_SAVE_OPS, apply_recompute, recompute_flags
from ._saved_bytes import (
    block_options,
    block_saved_bytes,
    block_saved_terms,
    is_block,
    stack_saved_bytes,
    stack_shared_bytes,
)

__all__ = [
    "BlockProfile", "register_block_rule", "block_options", "is_block", "stack_shared_bytes",
    "MemoryEstimate",
    "estimate_memory",
    "residual_stream_bytes",
    "GraphView",
    "graph_view",
    "trunk_name",
    "in_flight_micro_batches",
    "BLOCK_OPTIONS",
    "FP8_RECIPES",
    "RecomputePlan",
    "SAC_MATMUL_OPS",
    "apply_fp8",
    "block_option_costs",
    "fp8_filter",
    "fp8_linear_names",
    "fp8_supported",
    "offload_activations",
    "plan_recompute",
    "solve_recompute",
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

__version__ = "0.5.0"
