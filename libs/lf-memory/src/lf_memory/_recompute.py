"""Activation recomputation (activation checkpointing), switched on per block.

A checkpointed block keeps only its inputs during forward; backward runs its
forward a second time to rebuild the activations it needs (Chen et al. 2016,
"Training Deep Nets with Sublinear Memory Cost"; the per-layer "full
recompute" of Megatron-LM, Korthikanti et al. 2022). The planner in lf-memory
decides *which* blocks; this module only applies that decision.

Built on PyTorch's composable ``torch.distributed._composable.checkpoint``: it
installs forward pre/post hooks instead of wrapping the module, so parameter
names and ``state_dict`` keys stay unchanged (DCP checkpoints and HF weight
maps keep working) and it needs no process group. It is the same mechanism
TorchTitan uses and composes with ``fully_shard`` (apply order: TP ->
recompute -> compile -> FSDP). Where ``torch.distributed`` is not built in,
the fallback replaces the block's bound ``forward`` with one that calls
``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: also no new
submodule, so keys stay unchanged too (a ``copy.deepcopy`` of such a block
would still call the original's forward: apply it after copying).

Side effect to know: the composable backend re-runs the block through
``module.__call__``, so forward pre-hooks of the block and hooks of its
children fire again during recomputation (post-hooks late in the block may
not: recomputation stops as soon as the tensors backward needs are rebuilt).
Hooks with side effects (counters, auxiliary losses) must tolerate that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Literal

from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint_fn

try:
    from torch.distributed._composable import checkpoint as _composable_checkpoint
except ImportError:  # torch built without distributed
    _composable_checkpoint = None

__all__ = ["apply_activation_checkpointing"]

_Backend = Literal["composable", "function"]
_FALLBACK_MARK = "_lf_memory_checkpointed"


def _default_backend() -> _Backend:
    return "composable" if _composable_checkpoint is not None else "function"


def _is_checkpointed(module: nn.Module) -> bool:
    if module.__dict__.get(_FALLBACK_MARK, False):
        return True
    return _composable_checkpoint is not None and _composable_checkpoint.state(module) is not None


def _checkpoint_forward(module: nn.Module, context_fn: Callable | None = None) -> None:
    """Fallback: route ``module.forward`` through non-reentrant checkpointing."""
    inner_forward = module.forward
    extra = {} if context_fn is None else {"context_fn": context_fn}

    @functools.wraps(inner_forward)
    def forward(*args, **kwargs):
        return _checkpoint_fn(inner_forward, *args, use_reentrant=False, **extra, **kwargs)

    module.forward = forward  # instance attribute: no new submodule, same keys
    module.__dict__[_FALLBACK_MARK] = True


def _resolve_flags(num_blocks: int, enabled: bool | Sequence[bool]) -> list[bool]:
    if isinstance(enabled, bool):
        return [enabled] * num_blocks
    if isinstance(enabled, (str, bytes)) or not isinstance(enabled, Sequence):
        raise ValueError(
            f"enabled must be a bool or a sequence of bools, got {type(enabled).__name__}"
        )
    if len(enabled) != num_blocks:
        raise ValueError(
            f"enabled must have one entry per block (len(blocks)={num_blocks}), "
            f"got {len(enabled)} entries"
        )
    for index, flag in enumerate(enabled):
        if not isinstance(flag, bool):
            raise ValueError(f"enabled[{index}] must be a bool, got {flag!r}")
    return list(enabled)


def _apply(
    blocks: nn.ModuleList,
    enabled: bool | Sequence[bool],
    backend: _Backend,
    context_fn: Callable | Sequence[Callable | None] | None = None,
) -> list[int]:
    """Checkpoint the chosen blocks; ``context_fn`` (selective checkpointing) goes to the backend.

    ``context_fn`` is one function for all blocks or a list with one entry (or None) per block.
    """
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"blocks must be a torch.nn.ModuleList, got {type(blocks).__name__}")
    flags = _resolve_flags(len(blocks), enabled)
    chosen = [index for index, flag in enumerate(flags) if flag]
    seen: dict[int, int] = {}
    for index in chosen:  # validate everything before touching anything
        block = blocks[index]
        if _is_checkpointed(block):
            raise ValueError(
                f"blocks[{index}] ({type(block).__name__}) already has activation checkpointing"
            )
        if id(block) in seen:
            raise ValueError(
                f"blocks[{index}] is the same module as blocks[{seen[id(block)]}]; "
                "it can be checkpointed only once"
            )
        seen[id(block)] = index
    per_block = context_fn if isinstance(context_fn, (list, tuple)) else [context_fn] * len(blocks)
    if len(per_block) != len(blocks):
        raise ValueError(f"context_fn must have one entry per block ({len(blocks)}), got {len(per_block)}")
    for index in chosen:
        fn = per_block[index]
        if backend == "composable":
            extra = {} if fn is None else {"context_fn": fn}
            _composable_checkpoint(blocks[index], **extra)
        else:
            _checkpoint_forward(blocks[index], fn)
    return chosen


def apply_activation_checkpointing(
    blocks: nn.ModuleList, enabled: bool | Sequence[bool]
) -> list[int]:
    """Recompute the activations of the chosen blocks in backward, in place.

    Each chosen block saves only its inputs in forward and re-runs its forward
    during backward. Outputs and gradients are bitwise identical to running
    without recomputation when the block is deterministic (dropout is replayed
    with the saved RNG state). Parameter names and ``state_dict`` keys do not
    change (see module docstring for the backend).

    Args:
        blocks: the repeated blocks of a model (e.g. ``model.layers``).
        enabled: ``True`` / ``False`` for all blocks, or one bool per block.

    Returns:
        The indices of the blocks now checkpointed, ascending.

    Raises:
        TypeError: ``blocks`` is not an ``nn.ModuleList``.
        ValueError: ``enabled`` is a sequence whose length differs from
            ``len(blocks)`` or holds a non-bool; a chosen block is already
            checkpointed (also by an earlier call) or appears twice. Nothing is
            changed when it raises.

    Example:
        >>> blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        >>> apply_activation_checkpointing(blocks, [True, False, True, False])
        [0, 2]
    """
    return _apply(blocks, enabled, _default_backend())
