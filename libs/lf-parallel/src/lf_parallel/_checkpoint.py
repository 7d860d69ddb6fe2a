"""Training-state checkpoints with DCP (``torch.distributed.checkpoint``), resharding between plans.

``get_state_dict`` / ``set_state_dict`` give plan-independent keys (the model's own
parameter names, optimizer state keyed by them) holding DTensors or plain tensors;
DCP writes each rank's shards plus global metadata, so a checkpoint written under
one plan (ZeRO-3 over dp=4) loads under another (tp=2 x dp=2): each rank reads
exactly the slices its new shards need.

Atomicity: every rank writes into ``<dst>.tmp``; after all ranks are done, rank 0
writes the completion marker (``.lf_complete``) into it and renames it to ``dst``
(one ``os.replace``, atomic on POSIX). A folder without the marker is never loaded,
so a crash mid-write leaves only a ``.tmp`` folder that the next save replaces.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

MARKER = ".lf_complete"
"""File whose presence marks a checkpoint folder as completely written."""


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save_checkpoint(dst: str | os.PathLike, model: nn.Module, optimizer=None, *, extra: dict | None = None) -> Path:
    """Write model (and optimizer) state of every rank to the folder ``dst``, atomically.

    Call on every rank with the same ``dst``. ``extra`` (JSON-serializable, e.g. the step and the plan's
    ``describe()``) is written by rank 0 into the marker file.

    Raises:
        FileExistsError: ``dst`` already exists (checkpoints are never overwritten in place).
    """
    dst = Path(dst)
    if dst.exists():
        raise FileExistsError(f"checkpoint folder {dst} already exists; pick a new folder per step")
    tmp = dst.with_name(dst.name + ".tmp")
    if _rank() == 0:
        if tmp.exists():
            shutil.rmtree(tmp)  # a half-written earlier attempt
        tmp.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    dcp.save(state, checkpoint_id=str(tmp))
    _barrier()
    if _rank() == 0:
        (tmp / MARKER).write_text(json.dumps(extra or {}))
        os.replace(tmp, dst)
    _barrier()
    return dst


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a checkpoint folder with its completion marker."""
    return (Path(path) / MARKER).is_file()


def load_checkpoint(src: str | os.PathLike, model: nn.Module, optimizer=None) -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` (under any plan) into ``model`` / ``optimizer``
    as they are sharded now. Call on every rank. Returns the ``extra`` dict saved with it.

    Raises:
        FileNotFoundError: ``src`` is missing or has no completion marker (an interrupted write).
    """
    src = Path(src)
    if not is_complete(src):
        raise FileNotFoundError(f"checkpoint {src} is missing or incomplete (no {MARKER} marker); "
                                f"it was not completely written and is never loaded")
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    dcp.load(state, checkpoint_id=str(src))
    if optimizer is not None:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={})
    return json.loads((src / MARKER).read_text() or "{}")


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder directly under ``root`` (by name order), or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.is_dir() and is_complete(p))
    return done[-1] if done else None
