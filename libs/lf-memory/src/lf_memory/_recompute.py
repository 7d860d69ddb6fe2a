"""Activation recomputation (activation checkpointing), switched on per block.

A checkpointed block keeps only its inputs during forward; backward runs its
forward a second time to rebuild the activations it needs (Chen et al. 2016,
"Training Deep Nets with Sublinear Memory Cost"; the per-layer "full
recompute" of Megatron-LM, Korthikanti et al. 2022). The planner in lf-memory
decides *which* blocks; this module only applies that decision.

Backend (``"function"``, the default): the block's ``forward`` is replaced by
a bound method that calls ``torch.utils.checkpoint.checkpoint(use_reentrant=
False)`` on the original ``forward``. No submodule is added, so parameter
names and ``state_dict`` keys stay unchanged (DCP checkpoints and HF weight
maps keep working), it needs no process group, and a ``copy.deepcopy`` of the
block checkpoints the copy's own forward. Hooks registered on the block itself
(by anyone, before or after) run once per step, *outside* the recomputed
region; hooks of its children run inside it, in forward and again in
recomputation. This is what lets recomputation compose with the other
libraries that hook blocks (the semantics of torchtitan's
``checkpoint_wrapper`` inside the FSDP unit, apply order TP -> recompute ->
compile -> FSDP): FSDP2's pre-forward hook and lf-parallel's hooks never run
in the recomputed region.

Backend ``"composable"`` (``torch.distributed._composable.checkpoint``, kept
for comparison; the default up to lf-memory 0.3.0): installs forward pre/post
hooks and recomputes through ``module.__call__``, so the block's forward
pre-hooks, including those of other libraries, fire again during
recomputation. That broke two compositions: a hook that splits the sequence
(it split an already split input again: CheckpointError) and FSDP2 with a
mixed-precision policy under selective checkpointing (FSDP's pre-forward,
replayed inside the region, calls profiler ops that the forward never
recorded: "profiler._record_function_enter_new ... not found in storage").
"""

from __future__ import annotations

import types
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
_INNER_FORWARD = "_lf_memory_inner_forward"
_CONTEXT_FN = "_lf_memory_context_fn"


def _default_backend() -> _Backend:
    return "function"


def _is_checkpointed(module: nn.Module) -> bool:
    if module.__dict__.get(_FALLBACK_MARK, False):
        return True
    return _composable_checkpoint is not None and _composable_checkpoint.state(module) is not None


def _checkpointed_forward(self: nn.Module, *args, **kwargs):
    """The forward of a ``"function"``-checkpointed module (bound to it with ``types.MethodType``)."""
    inner_forward, context_fn = self.__dict__[_INNER_FORWARD], self.__dict__[_CONTEXT_FN]
    extra = {} if context_fn is None else {"context_fn": context_fn}
    return _checkpoint_fn(inner_forward, *args, use_reentrant=False, **extra, **kwargs)


def _checkpoint_forward(module: nn.Module, context_fn: Callable | None = None) -> None:
    """Route ``module.forward`` through non-reentrant checkpointing (the ``"function"`` backend).

    Both the original forward (a bound method, or an instance-level forward set earlier) and the new one
    are bound methods stored on the instance, so ``copy.deepcopy`` rebinds them to the copy.
    """
    module.__dict__[_INNER_FORWARD] = module.forward
    module.__dict__[_CONTEXT_FN] = context_fn
    module.forward = types.MethodType(_checkpointed_forward, module)  # no new submodule, same keys
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
    change. Hooks on a chosen block run once per step, outside the
    recomputed region (see the module docstring for the backend).

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
