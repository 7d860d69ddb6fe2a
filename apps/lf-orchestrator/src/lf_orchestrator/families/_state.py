"""Sharded checkpoints of a family run: DCP folders, atomic, keep-last-k, optionally written in the background.

Layout under a run folder::

    checkpoints/step-00000500/.metadata, __<rank>_0.distcp   model + optimizer shards (DCP, every rank writes its own)
    checkpoints/step-00000500/train_state.pt   scheduler, loss scaler, sampler per dp rank, RNG per rank, step
    checkpoints/step-00000500/.lf_complete     completion marker: {"step", "plan", "world_size"}
    checkpoints/latest                          name of the newest complete checkpoint

Every rank writes its shards into ``step-XXXXXXXX.tmp``; rank 0 then writes
``train_state.pt`` and the marker and renames the folder (``lf_parallel.save_checkpoint``);
``latest`` is replaced atomically after the rename, and only then are checkpoints
beyond the newest ``keep`` deleted. A crash (SIGKILL included) at any point leaves the
previous checkpoint complete and ``latest``; a folder without its marker is never loaded.

Model keys are the trainer's ``LossModule`` names (``model.`` + the recipe model's
names); the optimizer state is flattened per parameter name, so a checkpoint loads
under any plan and world size: DCP reads the slices each rank's new shards need.
Under pipeline parallel each rank saves and loads its stages (one, or several with an
interleaved schedule) through one ``StageView``
(:mod:`lf_orchestrator.train._pipeline_step`) holding the same keys for the layers it
owns, so pp and non-pp checkpoints load into each other and :func:`load_model_weights`
reads the whole model from either.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from lf_orchestrator.checkpoint import damaged, load_weights, write_text_atomic
from lf_parallel import (
    MARKER,
    PendingCheckpoint,
    UnsafeCheckpointError,
    async_save_checkpoint,
    checkpoint_extra,
    is_complete,
    load_checkpoint,
    safe_torch_load,
    save_checkpoint,
)

TRAIN_STATE_FILE = "train_state.pt"
"""Rank 0's small training state inside a checkpoint folder (``torch.load(weights_only=True)``)."""
PREFIX = "model."
"""The trainer's ``LossModule`` prefix in front of the recipe model's parameter names."""


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's torch RNG states: CPU, and CUDA of ``device`` when it is a GPU."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore :func:`rng_state` (a CUDA state is restored only on a GPU run)."""
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def gather_objects(obj: Any, distributed: bool) -> list[Any]:
    """``obj`` of every rank, indexed by global rank (``[obj]`` in a single process)."""
    if not distributed:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def load_model_weights(path: Path) -> dict[str, torch.Tensor]:
    """The recipe model's full weights (its own names, CPU) from a checkpoint folder; one process, no group.
    Folders of the earlier full-state layout (``model.safetensors`` + ``state.pt``) load too.

    The same reader as ``lf eval`` (:func:`lf_orchestrator.checkpoint.load_weights`).

    Raises:
        FileNotFoundError: the folder is missing or incomplete (names it).
        CheckpointError: unreadable shards, or weights holding NaN/inf (names the file and tensor).
    """
    return load_weights(path)


class FamilyCheckpointer:
    """Saves and restores the sharded state of one family run (call every method on every rank).

    Args:
        run_dir: the run folder (checkpoints go to ``run_dir/checkpoints``).
        distributed: whether a process group is up (every rank then takes part in each save).
        keep: newest complete checkpoints kept (``train.keep_checkpoints``, >= 1).
        async_save: write in the background (``train.async_checkpoint``); needs a CPU (gloo) group,
            which is made here once, on every rank.

    Raises:
        ValueError: ``keep < 1`` (names ``train.keep_checkpoints``).
    """

    def __init__(self, run_dir: Path, *, distributed: bool, keep: int, async_save: bool = False):
        if keep < 1:
            raise ValueError(f"train.keep_checkpoints must be >= 1, got {keep}")
        self.root = Path(run_dir) / "checkpoints"
        self.distributed, self.keep, self.async_save = distributed, keep, async_save
        self.rank = dist.get_rank() if distributed else 0
        self._group = dist.new_group(backend="gloo") if async_save and distributed else None
        self._pending: PendingCheckpoint | None = None

    def save(self, step: int, module: torch.nn.Module, optimizer, train_state: dict, plan: str) -> Path:
        """Checkpoint ``step``: model + optimizer shards of every rank, ``train_state`` (rank 0's is written;
        it must already hold every rank's per-rank entries) and the plan. Returns the folder (committed
        when this returns, unless asynchronous)."""
        self.wait()
        dst = self.root / f"step-{step:08d}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if dst.exists():  # written by an attempt that was abandoned after it (never loaded: older latest)
                shutil.rmtree(dst)
        if self.distributed:
            dist.barrier()
        buf = io.BytesIO()
        torch.save(train_state, buf)
        extra = {"step": step, "plan": plan, "world_size": dist.get_world_size() if self.distributed else 1}
        files = {TRAIN_STATE_FILE: buf.getvalue()}
        if self.async_save:
            self._pending = async_save_checkpoint(dst, module, optimizer, extra=extra, files=files,
                                                  process_group=self._group, on_commit=self._after_commit)
            return dst
        save_checkpoint(dst, module, optimizer, extra=extra, files=files)
        if self.rank == 0:
            self._after_commit(dst)
        return dst

    def _after_commit(self, dst: Path) -> None:
        """Rank 0: point ``latest`` at the committed ``dst``, then delete checkpoints beyond the newest ``keep``
        and leftover ``.tmp`` folders of steps before it."""
        write_text_atomic(self.root / "latest", dst.name)
        done = sorted(p for p in self.root.glob("step-*") if not p.name.endswith(".tmp") and is_complete(p))
        for old in done[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for tmp in self.root.glob("step-*.tmp"):
            if tmp.name.removesuffix(".tmp") < dst.name:
                shutil.rmtree(tmp, ignore_errors=True)

    def wait(self) -> Path | None:
        """Await the asynchronous save in flight (if any); returns its folder.

        Raises:
            RuntimeError: the background write failed.
        """
        pending, self._pending = self._pending, None
        return pending.wait() if pending is not None else None

    def close(self) -> None:
        """Await the save in flight and line the ranks up, so the last checkpoint is committed on return."""
        try:
            self.wait()
        finally:
            if self.distributed:
                dist.barrier()

    def load(self, path: Path, module: torch.nn.Module, optimizer) -> tuple[dict, dict]:
        """Load ``path`` into ``module`` / ``optimizer`` as they are sharded now (any plan, any world size).

        Returns:
            (train_state, extra): rank 0's training state and the marker's ``{"step", "plan", "world_size"}``.

        Raises:
            FileNotFoundError: ``path`` is missing or incomplete, or lacks ``train_state.pt`` (names the file).
            UnsafeCheckpointError: a pickle of the folder names a class lf does not load (names file and class).
        """
        path = Path(path)
        extra = checkpoint_extra(path)
        state_file = path / TRAIN_STATE_FILE
        if not state_file.is_file():
            raise FileNotFoundError(f"checkpoint {path}: missing {TRAIN_STATE_FILE} (found {MARKER}: written by "
                                    f"another trainer?)")
        try:
            load_checkpoint(path, module, optimizer)
        except UnsafeCheckpointError:  # names the file and the class it refused; not damage to delete
            raise
        except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
            raise damaged(path, "the DCP shards", err, plural=True) from None
        try:
            train_state = safe_torch_load(state_file)
        except UnsafeCheckpointError:
            raise
        except Exception as err:
            raise damaged(path, TRAIN_STATE_FILE, err) from None
        return train_state, extra


def describe_reshard(extra: dict, plan: str, world_size: int) -> str | None:
    """A log line when the checkpoint's plan or world size differs from this run's, else None."""
    old_plan, old_world = extra.get("plan"), extra.get("world_size")
    if old_plan == plan and old_world == world_size:
        return None
    return (f"checkpoint step {extra.get('step')} was written under plan {old_plan!r} on {old_world} processes; "
            f"resharding it (DCP) to plan {plan!r} on {world_size} processes")


def reshard_sampler(states: list[dict], dp_rank: int, dp: int) -> tuple[dict, str | None]:
    """This dp rank's sampler position from the positions of every dp rank of the checkpoint's plan.

    ``lf_data.ResumableSampler`` deals each epoch's permutation round-robin over the dp ranks, so the
    samples consumed so far are the permutation's first ``sum(offsets)`` entries under any dp size; the new
    rank continues at ``sum(offsets) / dp`` of the same epoch. That is the uninterrupted run's batch order
    when the global micro-batch (``dp * micro_batch``) is unchanged.

    Returns:
        (``{"epoch", "offset"}`` for ``load_state_dict``, a note when the position does not split evenly).
    """
    if len(states) == dp:
        return states[dp_rank], None
    epoch, consumed = int(states[0]["epoch"]), sum(int(s["offset"]) for s in states)
    note = None
    if consumed % dp:
        note = (f"the data position ({consumed} samples into epoch {epoch}) does not split over dp={dp}; "
                f"each rank continues at {consumed // dp}")
    return {"epoch": epoch, "offset": consumed // dp}, note
