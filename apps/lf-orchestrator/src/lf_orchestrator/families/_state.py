"""Full (unsharded) model and optimizer state of a family run, for ``checkpoint.py``'s atomic checkpoints.

One checkpoint format for every plan: ``get_model_state_dict`` / ``get_optimizer_state_dict``
with ``full_state_dict=True`` gather DTensor (TP) and FSDP2 (ZeRO-2/3) shards into plain
tensors on rank 0; loading hands every rank the full tensors and
``set_model_state_dict`` / ``set_optimizer_state_dict`` cut out its shards, so a run
resumes under another plan. ZeRO-1's ``ZeroRedundancyOptimizer`` is consolidated on
rank 0 instead. Gathering costs a full copy on rank 0: right for the model sizes this
trainer runs on one node; DCP sharded checkpoints (``lf_parallel.save_checkpoint``)
are the way for large models (not wired in yet).

Keys are the recipe model's own names (the trainer's ``LossModule`` prefix ``model.`` is
removed), so ``model.safetensors`` loads into a bare recipe model.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

PREFIX = "model."


def _is_zero1(optimizer) -> bool:
    return type(optimizer).__name__ == "ZeroRedundancyOptimizer"


def gather_state(module: torch.nn.Module, optimizer, is_main: bool) -> tuple[dict, dict]:
    """(model tensors, optimizer state) as full tensors on rank 0 (empty dicts elsewhere); call on every rank."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(module, options=opts)
    if _is_zero1(optimizer):
        optimizer.consolidate_state_dict(to=0)
        optim_sd = optimizer.state_dict() if is_main else {}
    else:
        optim_sd = get_optimizer_state_dict(module, optimizer, options=opts)
    model_sd = {k.removeprefix(PREFIX): v for k, v in model_sd.items()}
    return (model_sd, optim_sd) if is_main else ({}, {})


def load_state(module: torch.nn.Module, optimizer, model_sd: dict, optim_sd: dict) -> None:
    """Load full tensors (every rank passes the same dicts) into the possibly sharded module and optimizer."""
    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, {PREFIX + k: v for k, v in model_sd.items()}, options=opts)
    if _is_zero1(optimizer):
        optimizer.load_state_dict(optim_sd)
    else:
        set_optimizer_state_dict(module, optimizer, optim_sd, options=opts)
