"""Training-state checkpoints with DCP (``torch.distributed.checkpoint``), resharding between plans.

``get_state_dict`` / ``set_state_dict`` give plan-independent keys (the model's own
parameter names; the optimizer state flattened to ``state.<name>.<key>`` and
``param_groups.<name>.<key>``) holding DTensors or plain tensors; DCP writes each
rank's shards plus global metadata, so a checkpoint written under one plan (ZeRO-3
over dp=4) loads under another (tp=2 x dp=2): each rank reads exactly the slices its
new shards need. ZeRO-1's ``ZeroRedundancyOptimizer`` is saved through its local
optimizer: every rank writes the state of the parameters it owns, and the union is
the same flattened optimizer state as under any other plan.

Atomicity: every rank writes into ``<dst>.tmp``; after all ranks are done, rank 0
writes the extra ``files`` and then the completion marker (``.lf_complete``) into it
and renames it to ``dst`` (one ``os.replace``, atomic on POSIX). A folder without the
marker is never loaded, so a crash mid-write leaves only a ``.tmp`` folder that the
next save of that step replaces.

Loading runs no code from the folder: every DCP read goes through :mod:`._safe_load` (allow-listed
``.metadata`` unpickler, ``weights_only=True`` for the shards' non-tensor items); a refused file raises
:class:`~lf_parallel.UnsafeCheckpointError` naming it and the class it named.

:func:`async_save_checkpoint` copies the state to CPU memory now and writes it in a
background thread (``dcp.async_save``) over its own gloo process group, so the
training collectives of the main thread never interleave with the checkpoint's; the
marker and rename happen when the write finished on every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from lf_parallel._safe_load import SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpointError

MARKER = ".lf_complete"
"""File whose presence marks a checkpoint folder as completely written."""

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _barrier(group=None) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every single-process call, even with ``no_dist=True`` asked for explicitly."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _local_optimizer(optimizer):
    """The optimizer whose state this rank holds: ZeRO-1's local one, else ``optimizer`` (None: no optimizer)."""
    if optimizer is None:
        return []
    return optimizer.optim if type(optimizer).__name__ == "ZeroRedundancyOptimizer" else optimizer


def _state(model: nn.Module, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(model, _local_optimizer(optimizer), options=_OPTIONS)
    return {"model": model_sd, "optim": optim_sd} if optimizer is not None else {"model": model_sd}


def _prepare(dst: Path, group) -> Path:
    if dst.exists():
        raise FileExistsError(f"checkpoint folder {dst} already exists; pick a new folder per step")
    tmp = dst.with_name(dst.name + ".tmp")
    if _rank() == 0:
        if tmp.exists():
            shutil.rmtree(tmp)  # a half-written earlier attempt
        tmp.mkdir(parents=True)
    _barrier(group)
    return tmp


def _commit(tmp: Path, dst: Path, extra: dict | None, files: Mapping[str, bytes] | None) -> None:
    """Rank 0, after every rank's shards are written: extra files, marker, fsync, rename."""
    for name, data in (files or {}).items():
        (tmp / name).write_bytes(data)
    (tmp / MARKER).write_text(json.dumps(extra or {}))
    for f in tmp.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, dst)


def save_checkpoint(dst: str | os.PathLike, model: nn.Module, optimizer=None, *, extra: dict | None = None,
                    files: Mapping[str, bytes] | None = None) -> Path:
    """Write model (and optimizer) state of every rank to the folder ``dst``, atomically.

    Call on every rank with the same ``dst``. ``extra`` (JSON-serializable, e.g. the step and the plan's
    ``describe()``) is written by rank 0 into the marker file; ``files`` (name -> bytes, rank 0's are used)
    are written into the folder before the marker.

    Raises:
        FileExistsError: ``dst`` already exists (checkpoints are never overwritten in place).
    """
    dst = Path(dst)
    tmp = _prepare(dst, None)
    with _single_process_quiet():
        dcp.save(_state(model, optimizer), checkpoint_id=str(tmp), no_dist=_no_dist())
    _barrier()
    if _rank() == 0:
        _commit(tmp, dst, extra, files)
    _barrier()
    return dst


class PendingCheckpoint:
    """An :func:`async_save_checkpoint` in flight; :meth:`wait` returns its folder once committed."""

    def __init__(self, future, tmp: Path, dst: Path, extra: dict | None, files: Mapping[str, bytes] | None,
                 on_commit: Callable[[Path], None] | None):
        self.path = dst
        self._tmp, self._extra, self._files, self._on_commit = tmp, extra, files, on_commit
        self._done, self._error = threading.Event(), None
        future.add_done_callback(self._finish)

    def _finish(self, future) -> None:
        try:
            future.result()  # DCP's coordinator returns after every rank reported its write
            if _rank() == 0:
                _commit(self._tmp, self.path, self._extra, self._files)
                if self._on_commit is not None:
                    self._on_commit(self.path)
        except BaseException as err:  # noqa: BLE001 - re-raised by wait() in the main thread
            self._error = err
        finally:
            self._done.set()

    def done(self) -> bool:
        """Whether the write (and, on rank 0, the commit) finished."""
        return self._done.is_set()

    def wait(self) -> Path:
        """Block until written and committed (rank 0) or written (other ranks); returns the folder.

        Raises:
            RuntimeError: the background write or commit failed (chained to its error).
        """
        self._done.wait()
        if self._error is not None:
            raise RuntimeError(f"asynchronous checkpoint {self.path} failed: {self._error}") from self._error
        return self.path


def async_save_checkpoint(dst: str | os.PathLike, model: nn.Module, optimizer=None, *, extra: dict | None = None,
                          files: Mapping[str, bytes] | None = None, process_group=None,
                          on_commit: Callable[[Path], None] | None = None) -> PendingCheckpoint:
    """:func:`save_checkpoint` that returns once the state is copied to CPU memory; written in the background.

    Call on every rank. ``process_group`` must be a gloo group used only for checkpoints (e.g.
    ``dist.new_group(backend="gloo")``, made once on every rank); the default group is used for the
    folder set-up barrier only. ``on_commit(dst)`` runs on rank 0 in the writer thread after the rename.
    Await the returned :class:`PendingCheckpoint` before the next save and before the process exits.

    Raises:
        FileExistsError: ``dst`` already exists.
    """
    dst = Path(dst)
    tmp = _prepare(dst, None)
    future = dcp.async_save(_state(model, optimizer), checkpoint_id=str(tmp), process_group=process_group,
                            no_dist=_no_dist())
    return PendingCheckpoint(future, tmp, dst, extra, files, on_commit)


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a checkpoint folder with its completion marker."""
    return (Path(path) / MARKER).is_file()


def _require_complete(src: Path) -> None:
    if not is_complete(src):
        raise FileNotFoundError(f"checkpoint {src} is missing or incomplete (no {MARKER} marker); "
                                f"it was not completely written and is never loaded")


def _require_files(src: Path) -> None:
    """Refuse a complete-marked checkpoint whose DCP files were removed since (before DCP's own traceback)."""
    if not (src / ".metadata").is_file():
        raise FileNotFoundError(f"checkpoint {src} is damaged: its DCP index {src / '.metadata'} is missing")
    meta = SafeFileSystemReader(str(src)).read_metadata()
    names = sorted({getattr(info, "relative_path", None) for info in (meta.storage_data or {}).values()} - {None})
    missing = [n for n in names if not (src / n).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {src} is damaged: shard file(s) {missing} listed in its .metadata "
                                f"are missing")


def _safe_dcp_load(state: dict, src: Path, no_dist: bool) -> None:
    """``dcp.load`` through the safe reader and planner; a refusal on any rank is re-raised as itself."""
    try:
        with _single_process_quiet():
            dcp.load(state, storage_reader=SafeFileSystemReader(str(src)), planner=SafeLoadPlanner(src),
                     no_dist=no_dist)
    except dcp.CheckpointException as err:  # DCP gathers every rank's exception into one
        refused = [exc for exc, _ in err.failures.values() if isinstance(exc, UnsafeCheckpointError)]
        if refused:
            raise refused[0] from None
        raise


def checkpoint_extra(src: str | os.PathLike) -> dict:
    """The ``extra`` dict saved with a complete checkpoint.

    Raises:
        FileNotFoundError: ``src`` is missing or has no completion marker.
    """
    src = Path(src)
    _require_complete(src)
    return json.loads((src / MARKER).read_text() or "{}")


def load_checkpoint(src: str | os.PathLike, model: nn.Module, optimizer=None) -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` (under any plan) into ``model`` / ``optimizer``
    as they are sharded now. Call on every rank. Returns the ``extra`` dict saved with it.

    Raises:
        FileNotFoundError: ``src`` is missing or has no completion marker (an interrupted write), or its
            DCP ``.metadata`` or a shard file it lists was removed after the write.
        UnsafeCheckpointError: ``.metadata`` or a shard's non-tensor item names a class lf does not load
            (names the file and the class; nothing of it ran).
    """
    src = Path(src)
    extra = checkpoint_extra(src)
    _require_files(src)
    state = _state(model, optimizer)
    _safe_dcp_load(state, src, _no_dist())
    set_state_dict(model, _local_optimizer(optimizer), model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}), options=_OPTIONS)
    return extra


def read_full_tensors(src: str | os.PathLike, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU tensors of a complete checkpoint whose DCP keys start with ``prefix``, keyed
    without it; one process, no process group (e.g. the weights for inference or export).

    Raises:
        FileNotFoundError: ``src`` is missing or incomplete.
        UnsafeCheckpointError: ``.metadata`` names a class lf does not load (names the file and the class).
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    src = Path(src)
    _require_complete(src)
    _require_files(src)
    meta = SafeFileSystemReader(str(src)).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
             if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    _safe_dcp_load(state, src, True)
    return {k.removeprefix(prefix): v for k, v in state.items()}


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder directly under ``root`` (by name order), or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.is_dir() and is_complete(p))
    return done[-1] if done else None
