"""Atomic checkpoints: weights as safetensors, training state with ``weights_only`` loading.

Layout under a run folder::

    checkpoints/step-00000500/model.safetensors   model weights (HF-compatible tensors)
    checkpoints/step-00000500/state.pt            optimizer, scheduler, sampler, RNG, step
    checkpoints/latest                            name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder, flushed, then renamed
into place; ``latest`` is replaced atomically afterwards. A crash at any point
leaves the previous checkpoint loadable and never a partial one marked latest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    _fsync(tmp)
    os.replace(tmp, path)


def save_checkpoint(run_dir: Path, step: int, model_state: dict[str, torch.Tensor],
                    train_state: dict[str, Any], *, keep: int) -> Path:
    """Write checkpoint ``step`` atomically, point ``latest`` at it, keep the newest ``keep``."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    tensors = {k: v.detach().contiguous().cpu() for k, v in model_state.items()}
    save_file(tensors, str(tmp / MODEL_FILE))
    torch.save(train_state, tmp / STATE_FILE)
    for f in (MODEL_FILE, STATE_FILE):
        _fsync(tmp / f)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    write_text_atomic(root / "latest", final.name)
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _complete(path: Path) -> bool:
    """Both files of this module's layout, or the llm/vlm/video families' DCP folder with its marker."""
    return (path / MODEL_FILE).is_file() and (path / STATE_FILE).is_file() or (path / ".lf_complete").is_file()


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if _complete(candidate):
            return candidate
    done = [p for p in sorted(root.glob("step-*")) if _complete(p)]
    return done[-1] if done else None


class CheckpointError(ValueError):
    """A checkpoint folder that exists but cannot be used; the message names the file and what to do."""


def damaged(path: Path, name: str, err: BaseException | str) -> CheckpointError:
    """The error for an unreadable or invalid file ``name`` of checkpoint folder ``path``.

    The message names the file and says to delete the folder so that resuming takes the
    previous checkpoint; it never repeats a library's advice to load without ``weights_only``.
    """
    why = err if isinstance(err, str) else f"{type(err).__name__}"
    return CheckpointError(f"checkpoint {path}: {name} is damaged ({why}); delete {path} to resume from the "
                           f"previous checkpoint")


def check_finite_state(path: Path, name: str, state: dict[str, torch.Tensor]) -> None:
    """Raise :class:`CheckpointError` naming the first floating tensor of ``state`` with NaN/inf values."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise damaged(path, name, f"tensor {key!r} holds NaN or inf")


def load_checkpoint(path: Path, device: torch.device | str = "cpu"
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model state, training state) of a checkpoint folder; no arbitrary unpickling.

    Raises:
        FileNotFoundError: naming the missing file.
        CheckpointError: a file that does not parse, or weights holding NaN/inf (names the file and tensor).
    """
    path = Path(path)
    for f in (MODEL_FILE, STATE_FILE):
        if not (path / f).is_file():
            raise FileNotFoundError(f"checkpoint {path}: missing {f}")
    try:
        model_state = load_file(str(path / MODEL_FILE), device=str(device))
    except Exception as err:  # safetensors raises its own error types for truncated or garbled files
        raise damaged(path, MODEL_FILE, err) from None
    check_finite_state(path, MODEL_FILE, model_state)
    try:
        train_state = torch.load(path / STATE_FILE, map_location=device, weights_only=True)
    except Exception as err:  # UnpicklingError, EOFError, RuntimeError on truncated zip archives
        raise damaged(path, STATE_FILE, err) from None
    return model_state, train_state
