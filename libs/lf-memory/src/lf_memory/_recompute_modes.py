"""Recompute modes: none, full per block, selective per op, and every k-th block.

One entry function, :func:`apply_recompute`, turns the config's
``memory.recompute`` mode into per-block activation checkpointing on top of
:func:`lf_memory._recompute._apply` (``torch.utils.checkpoint`` around each
block's ``forward``: ``state_dict`` keys never change, and hooks that other
libraries put on a block, FSDP2's and lf-parallel's, stay outside the
recomputed region, so every mode composes with TP + SP and ZeRO-2/3):

- ``"none"``: nothing is recomputed; every block keeps what autograd saves.
- ``"full"``: every block keeps only its inputs and re-runs its forward in
  backward (Chen et al. 2016; Megatron-LM "full" recompute, Korthikanti et al.
  2022, arXiv 2205.05198).
- ``"selective"``: every block is checkpointed with PyTorch's selective
  activation checkpointing (SAC, ``torch.utils.checkpoint.
  create_selective_checkpoint_contexts``): the outputs of the ops in
  :data:`SAC_SAVE_OPS` (matrix products and fused attention) are kept from the
  forward pass, everything else (norms, activations, RoPE, masks, residual
  adds, views) is recomputed in backward. The expensive FLOPs are never run
  twice; the cheap, memory-hungry element-wise outputs are. This follows the
  op list of torchtitan's SAC policy (``torchtitan/distributed/
  activation_checkpoint.py``, ``_op_sac_save_list``: ``aten.mm``, the SDPA
  flash / efficient / cuDNN ops, ``reduce_scatter_tensor``, ``aten.max``) with
  two differences: torchtitan recomputes every second ``mm`` to save more
  memory, we save all of them (no recomputed GEMM FLOPs); and we add
  ``aten.addmm`` (a ``Linear`` with bias on CPU), ``aten.bmm`` and the CPU
  flash kernel ``_scaled_dot_product_flash_attention_for_cpu``.
- ``"every_k"``: full recompute on the blocks whose index ``i`` satisfies
  ``i % every == 0`` (``every=1`` is ``"full"``; ``every=2`` recomputes blocks
  0, 2, 4, ...), nothing on the others.
- ``"auto"``: one option per block from a :class:`lf_memory.RecomputePlan`
  (:func:`lf_memory.plan_recompute`, the knapsack planner): ``"none"``,
  ``"selective"``, ``"selective_attn"`` (selective checkpointing that keeps only
  the matmul outputs, :data:`SAC_MATMUL_OPS`, so attention is recomputed too) or
  ``"full"``.

Outputs and gradients equal those without recomputation bitwise in every mode
(recomputation replays the same kernels on the same inputs; RNG state is
restored for dropout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ._recompute import _apply, _Backend, _default_backend

__all__ = ["RECOMPUTE_MODES", "SAC_MATMUL_OPS", "SAC_SAVE_OPS", "RecomputeMode", "apply_recompute",
           "recompute_flags"]

RecomputeMode = Literal["none", "full", "selective", "every_k", "auto"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "full", "selective", "every_k")

_SAC_OP_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
SAC_SAVE_OPS: frozenset = frozenset(
    getattr(torch.ops.aten, name).default for name in _SAC_OP_NAMES if hasattr(torch.ops.aten, name)
)
"""ATen ops whose outputs ``"selective"`` keeps: ``mm``, ``addmm``, ``bmm`` and the
fused SDPA kernels (CPU flash, CUDA flash, memory-efficient, cuDNN) that exist in
this torch build. All other ops are recomputed."""

SAC_MATMUL_OPS: frozenset = frozenset(
    getattr(torch.ops.aten, name).default for name in ("mm", "addmm", "bmm"))
"""ATen ops whose outputs the ``"selective_attn"`` block option keeps (attention is recomputed)."""


def _sac_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Save matmul and fused-attention outputs, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in SAC_SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _sac_matmul_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Save matmul outputs only; recompute attention and everything else."""
    return CheckpointPolicy.MUST_SAVE if op in SAC_MATMUL_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn():
    """``context_fn`` for ``checkpoint``: fresh SAC contexts with :func:`_sac_policy`."""
    return create_selective_checkpoint_contexts(_sac_policy)


def selective_attn_context_fn():
    """``context_fn`` for ``checkpoint``: fresh SAC contexts keeping matmul outputs only."""
    return create_selective_checkpoint_contexts(_sac_matmul_policy)


_OPTION_CONTEXT = {"full": None, "selective": selective_context_fn, "selective_attn": selective_attn_context_fn}


def recompute_flags(num_blocks: int, mode: str, *, every: int = 2) -> list[bool]:
    """Which blocks ``mode`` checkpoints (``"selective"`` checkpoints all, per op).

    Raises:
        ValueError: unknown ``mode`` (lists the choices), ``every`` < 1, or
            ``num_blocks`` < 0.

    Example:
        >>> recompute_flags(5, "every_k", every=2)
        [True, False, True, False, True]
    """
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"memory.recompute must be one of {[*RECOMPUTE_MODES, 'auto']} "
                         f"('auto' needs apply_recompute(..., plan=...)), got {mode!r}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"memory.recompute_every must be an int >= 1, got {every!r}")
    if num_blocks < 0:
        raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
    if mode == "every_k":
        return [i % every == 0 for i in range(num_blocks)]
    return [mode != "none"] * num_blocks


def _apply_plan(module_list: nn.ModuleList, plan, backend: _Backend) -> list[int]:
    """Apply one option per block from ``plan.block_options()`` (see :func:`apply_recompute`)."""
    if plan is None or not hasattr(plan, "block_options"):
        raise ValueError("memory.recompute = 'auto' needs plan=RecomputePlan (lf_memory.plan_recompute), "
                         f"got {type(plan).__name__}")
    options = plan.block_options()
    if len(options) != len(module_list):
        raise ValueError(f"the recompute plan has {len(options)} blocks but {len(module_list)} were given")
    for index, (block, option) in enumerate(zip(module_list, options, strict=True)):
        if option not in _OPTION_CONTEXT and option != "none":
            raise ValueError(f"plan option for block {index} must be one of "
                             f"{['none', *_OPTION_CONTEXT]}, got {option!r}")
        node = getattr(block, "lf_node", None)
        expected = plan.block_names()[index]
        if node is not None and node.name != expected:
            raise ValueError(f"blocks[{index}] is IR node {node.name!r} but the plan's block {index} is {expected!r}")
    return _apply(module_list, [o != "none" for o in options], backend,
                  [_OPTION_CONTEXT.get(o) for o in options])


def _apply_mode(blocks, mode: str, every: int, backend: _Backend, plan=None) -> list[int]:
    if isinstance(blocks, nn.ModuleList):
        module_list = blocks
    elif isinstance(blocks, Sequence) and all(isinstance(b, nn.Module) for b in blocks):
        module_list = nn.ModuleList(blocks)  # a view for validation; modules are not copied
    else:
        raise TypeError(
            f"blocks must be an nn.ModuleList or a sequence of nn.Module, got {type(blocks).__name__}"
        )
    if mode == "auto":
        return _apply_plan(module_list, plan, backend)
    flags = recompute_flags(len(module_list), mode, every=every)
    context_fn = selective_context_fn if mode == "selective" else None
    return _apply(module_list, flags, backend, context_fn)


def apply_recompute(
    blocks: nn.ModuleList | Sequence[nn.Module], mode: str, *, every: int = 2, plan=None,
    backend: _Backend | None = None,
) -> list[int]:
    """Apply a recompute mode to the repeated blocks of a model, in place.

    Args:
        blocks: the transformer blocks (``nn.ModuleList``, or a list such as
            ``VLAModel.blocks``); modules are changed in place, keys unchanged.
        mode: ``"none"``, ``"full"``, ``"selective"``, ``"every_k"`` or
            ``"auto"`` (see the module docstring for what each keeps).
        every: the period ``k`` of ``"every_k"`` (ignored otherwise), >= 1.
        plan: with ``"auto"``, the :class:`lf_memory.RecomputePlan` to apply;
            its blocks are those of the graph in component order (the order of
            ``model.blocks`` in the lf-ir recipes), checked by IR node name.
        backend: ``"function"`` (the default: each chosen block's ``forward`` wrapped, its hooks outside the
            recomputed region) or ``"composable"`` (``torch.distributed._composable.checkpoint``).

    Returns:
        The indices of the blocks now checkpointed (fully or selectively), ascending.

    Raises:
        TypeError: ``blocks`` is neither an ``nn.ModuleList`` nor a sequence of modules.
        ValueError: unknown ``mode``, bad ``every``, a chosen block already
            checkpointed, ``"auto"`` without a plan or with a plan for other
            blocks (nothing changes when it raises).

    Example:
        >>> blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        >>> apply_recompute(blocks, "every_k", every=2)
        [0, 2]
        >>> apply_recompute(nn.ModuleList([nn.Linear(8, 8)]), "selective")
        [0]
    """
    if backend not in (None, "function", "composable"):
        raise ValueError(f"backend: expected 'function' or 'composable', got {backend!r}")
    return _apply_mode(blocks, mode, every, backend or _default_backend(), plan)

