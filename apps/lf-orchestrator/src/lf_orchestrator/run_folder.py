"""One `lf run` per run folder: an exclusive lock, and no empty folders left behind by runs that fail early.

:class:`RunFolder` is entered once per `lf run` process. :meth:`RunFolder.claim` takes a non-blocking
``flock`` on ``RUN/.lock`` for the rest of the run, so a second `lf run` on the same folder (``--resume RUN``
twice, a stray ``--run-dir``) stops at once with an error that names the folder and the holder's PID and host
instead of interleaving checkpoints and logs with the first.

Only global rank 0 takes the lock; the other ranks learn the outcome through one broadcast. Rank 0 is the
only process that writes the run folder's own files (config, plan, summary, metrics), every rank of one job
shares rank 0's fate (torchrun tears the job down when it fails), and a lock per rank would make the ranks of
one job, on a shared file system, conflict with each other. ``flock`` across hosts needs a file system that
supports it (local disks, NFSv4, Lustre mounted with ``-o flock``); where it does not, the lock still guards
against a second run on rank 0's host.

On an exception, a folder that this process created and in which nothing but the resolved config, the
set-up files derived from it (:data:`DISPOSABLE`: lock, tokenizers, normalization, corpus description, the
VLA's model.json, the video family's text encoder and VAE copy; all rewritten by a new run) and empty folders
were written is removed again. A folder given by the user (``--resume``, an existing ``--run-dir``) or one
holding anything else (checkpoints, metrics, plan, logs) is never removed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
from pathlib import Path
from types import TracebackType

LOCK_NAME = ".lock"
"""The lock file inside a run folder (kept after the run; its content names the last holder)."""
DISPOSABLE = frozenset({LOCK_NAME, "config.toml", "tokenizer.json", "corpus.json", "instruction_tokenizer.json",
                        "action_tokenizer.json", "action_tokens.json", "normalization.json", "vlm_template.json",
                        "model.json", "text_encoder.safetensors", "trained_instructions.json", "vae.safetensors"})
"""Top-level files written before training (the trainers' set-up) that do not keep a failed run's folder alive;
their atomic-write temporaries (``.NAME.*.tmp*``, :mod:`lf_orchestrator._atomic`) neither."""


class RunFolderLocked(ValueError):
    """Another process holds the run folder's lock; the message names the folder, the PID and the host."""


def _holder(lock_path: Path) -> str:
    try:
        text = lock_path.read_text().split()
    except OSError:
        text = []
    if not text:
        return "an unknown process"
    return f"PID {text[0]}" + (f" on host {text[1]}" if len(text) > 1 else "")


def _disposable_name(name: str) -> bool:
    return name in DISPOSABLE or any(name.startswith(f".{d}.") and ".tmp" in name for d in DISPOSABLE)


def _only_disposable(folder: Path, top: bool = True) -> bool:
    """Whether ``folder`` holds nothing but :data:`DISPOSABLE` files (at the top), their temporaries and empty
    folders."""
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            if not _only_disposable(entry, top=False):
                return False
        elif not top:
            return False
        elif not _disposable_name(entry.name):
            return False
    return True


class RunFolder:
    """The run folder of one `lf run` process: locked while the run lasts, removed if the run dies empty.

    Use as a context manager around the whole run; call :meth:`claim` once the folder's path is known.

    Args:
        ctx: the process's ``lf_parallel.DistContext`` (``is_main``, ``distributed``).
    """

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.path: Path | None = None
        self.created = False
        self.made_parents: list[Path] = []
        """Folders above the run folder that this process made (deepest first); removed with it when empty."""
        self._fd: int | None = None

    def claim(self, path: Path, *, created: bool) -> Path:
        """Lock ``path`` (rank 0; made if missing) and return it; every rank raises if the lock is taken.

        Args:
            path: the run folder.
            created: whether this process made the folder (only such a folder may be removed on failure);
                when ``path`` does not exist yet it is made here and counts as created.

        Raises:
            RunFolderLocked: another process holds ``path/.lock`` (names the folder, PID and host).
        """
        path = Path(path)
        error = [""]
        if self.ctx.is_main:
            if not path.exists():
                created = True
                self.made_parents += missing_dirs(path.parent)
            path.mkdir(parents=True, exist_ok=True)
            error[0] = self._lock(path)
        if self.ctx.distributed:
            import torch.distributed as dist

            dist.broadcast_object_list(error, src=0)
        if error[0]:
            raise RunFolderLocked(error[0])
        self.path, self.created = path, created
        return path

    def _lock(self, path: Path) -> str:
        lock_path = path / LOCK_NAME
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: held elsewhere
            os.close(fd)
            return (f"run folder {path} is in use by another `lf run` ({_holder(lock_path)} holds {lock_path}); "
                    f"wait for it to finish or stop it first")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd = fd
        return ""

    def release(self) -> None:
        """Drop the lock (idempotent); the lock file stays so that no other process locks a stale inode."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def discard_if_empty(self) -> bool:
        """Remove the folder if this process made it and it holds only the config; returns whether it did."""
        if not (self.ctx.is_main and self.created and self.path is not None and self.path.is_dir()):
            return False
        if not _only_disposable(self.path):
            return False
        shutil.rmtree(self.path, ignore_errors=True)
        for parent in self.made_parents:  # e.g. runs/ made for this run: only while empty
            try:
                parent.rmdir()
            except OSError:
                break
        return True

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is not None:
                self.discard_if_empty()
        finally:
            self.release()


def missing_dirs(path: Path) -> list[Path]:
    """``path`` and the folders above it that do not exist yet, deepest first."""
    path = Path(path)
    return [p for p in (path, *path.parents) if not p.exists()]


def announce_run_folder(run_dir: Path, ctx, console) -> None:
    """Rank 0 prints ``run folder: RUN``; called once the run starts (its trainer and plan are set up), so a
    run refused before that names no folder it removes again."""
    if ctx.is_main:
        console.print(f"run folder: [bold]{run_dir}[/]")


def new_run_dir(cfg, ctx) -> Path:
    """A fresh ``run.out_dir/<run.name>-<timestamp>[-i]`` folder made by rank 0 (never one another run created in
    the same second), its path broadcast to every rank."""
    import time

    import torch.distributed as dist

    name = [""]
    if ctx.is_main:
        base = Path(cfg.run.out_dir) / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        base.parent.mkdir(parents=True, exist_ok=True)
        for i in range(1, 1000):
            candidate = base if i == 1 else base.with_name(f"{base.name}-{i}")
            try:
                candidate.mkdir()
                name[0] = str(candidate)
                break
            except FileExistsError:
                continue
    if ctx.distributed:
        dist.broadcast_object_list(name, src=0)
    return Path(name[0])


def start_run_folder(cfg, ctx, resume: Path | None, run_dir: Path | None, console) -> Path:
    """The folder `lf run` trains in: ``run_dir`` (created), the ``resume`` folder, or a new one from
    :func:`new_run_dir`; for a new run rank 0 writes the resolved ``config.toml`` (atomically) before
    anything else. :func:`announce_run_folder` prints it once the run starts."""
    from lf_orchestrator.checkpoint import write_text_atomic
    from lf_orchestrator.config import to_toml

    if run_dir is None:
        run_dir = resume if resume is not None else new_run_dir(cfg, ctx)
    elif ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    if ctx.is_main and resume is None:
        write_text_atomic(run_dir / "config.toml", to_toml(cfg))
    return run_dir


def absolute_paths(cfg):
    """``cfg`` with its relative file paths made absolute against the working folder (``data.path``,
    ``corpus.cache_dir``, ``video.vae_weights``), so the run folder's ``config.toml`` serves ``--resume`` and
    ``lf sample`` from any folder."""
    import msgspec

    def absolute(path: str) -> str:
        return str(Path(path).resolve()) if path else path

    rep = msgspec.structs.replace
    return rep(cfg, data=rep(cfg.data, path=absolute(cfg.data.path)),
               corpus=rep(cfg.corpus, cache_dir=absolute(cfg.corpus.cache_dir)),
               video=rep(cfg.video, vae_weights=absolute(cfg.video.vae_weights)))
