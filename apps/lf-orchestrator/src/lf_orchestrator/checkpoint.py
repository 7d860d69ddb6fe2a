"""The checkpoints of a run folder: finding the newest, reading weights, and the errors for damaged files.

Training state is written by :class:`lf_orchestrator.families._state.FamilyCheckpointer` for every
trainer (sharded DCP folders, atomic, keep-last-k, optionally asynchronous; see that module for the
layout and :mod:`lf_orchestrator.train.state` for what goes with the shards)::

    checkpoints/step-00000500/.metadata, __<rank>_0.distcp   model + optimizer shards (DCP)
    checkpoints/step-00000500/train_state.pt                 schedule, scaler, samplers, RNG, step, plan
    checkpoints/step-00000500/.lf_complete                   completion marker
    checkpoints/latest                                       name of the newest complete checkpoint

Runs of lf-orchestrator 0.3 and before wrote one full-state folder per step instead (the *legacy*
layout, read here and never written any more)::

    checkpoints/step-00000500/model.safetensors   model weights
    checkpoints/step-00000500/state.pt            optimizer, scheduler, sampler, RNG, step

:func:`load_weights` reads the model weights of either layout (``lf eval``); the trainer resumes
either (a legacy one under a data-parallel plan of the world size that wrote it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from lf_orchestrator._atomic import write_text_atomic  # noqa: F401  (re-exported: its importers use this module)

MODEL_FILE = "model.safetensors"
"""Legacy layout: the model weights (safetensors)."""
STATE_FILE = "state.pt"
"""Legacy layout: the training state (``torch.load(weights_only=True)``)."""
MARKER = ".lf_complete"
"""DCP layout: the completion marker (``lf_parallel.MARKER``)."""
PREFIX = "model."
"""DCP layout: the trainers' prefix in front of the recipe model's parameter names."""


def is_legacy(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint folder of the legacy full-state layout."""
    return (Path(path) / MODEL_FILE).is_file() and (Path(path) / STATE_FILE).is_file()


def _complete(path: Path) -> bool:
    """A DCP folder with its marker, or both files of the legacy layout."""
    return (path / MARKER).is_file() or is_legacy(path)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder (DCP or legacy layout), or None.

    Completeness (the marker, or both legacy files renamed into place), not the ``latest`` pointer, decides:
    a save killed after its rename but before the pointer was replaced still counts, and an unfinished
    ``step-*.tmp`` folder never does.
    """
    root = Path(run_dir) / "checkpoints"
    done = [p for p in sorted(root.glob("step-*")) if p.is_dir() and not p.name.endswith(".tmp") and _complete(p)]
    return done[-1] if done else None


class CheckpointError(ValueError):
    """A checkpoint folder that exists but cannot be used; the message names the file and what to do."""


def damaged(path: Path, name: str, err: BaseException | str, *, plural: bool = False) -> CheckpointError:
    """The error for an unreadable or invalid file ``name`` of checkpoint folder ``path`` (``plural``: ``name``
    names several files, e.g. "the DCP shards", and takes "are").

    The message names the file and says to delete the folder so that resuming takes the
    previous checkpoint; it never repeats a library's advice to load without ``weights_only``.
    """
    why = err if isinstance(err, str) else f"{type(err).__name__}"
    return CheckpointError(f"checkpoint {path}: {name} {'are' if plural else 'is'} damaged ({why}); delete {path} to "
                           f"resume from the "
                           f"previous checkpoint")


def check_finite_state(path: Path, name: str, state: dict[str, torch.Tensor], *, plural: bool = False) -> None:
    """Raise :class:`CheckpointError` naming the first floating tensor of ``state`` with NaN/inf values."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise damaged(path, name, f"tensor {key!r} holds NaN or inf", plural=plural)


def load_checkpoint(path: Path, device: torch.device | str = "cpu"
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model state, training state) of a legacy-layout checkpoint folder; no arbitrary unpickling.

    Raises:
        FileNotFoundError: naming the missing file.
        CheckpointError: a file that does not parse, or weights holding NaN/inf (names the file and tensor).
        UnsafeCheckpointError: ``state.pt`` names a class lf does not load (names the file and the class).
    """
    from lf_parallel import UnsafeCheckpointError, safe_torch_load

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
        train_state = safe_torch_load(path / STATE_FILE, map_location=device)
    except UnsafeCheckpointError:  # names the file and the class it refused
        raise
    except Exception as err:  # UnpicklingError, EOFError, RuntimeError on truncated zip archives
        raise damaged(path, STATE_FILE, err) from None
    return model_state, train_state


def load_weights(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The recipe model's full weights (its own parameter names) from a checkpoint folder of either layout.

    One process, no process group: DCP shards written under any plan are read whole (``lf eval``, export).

    Raises:
        FileNotFoundError: ``path`` is missing, or neither complete layout (names the folder).
        CheckpointError: unreadable shards or weights holding NaN/inf (names the file and tensor).
        UnsafeCheckpointError: a pickle of the folder names a class lf does not load (names file and class).
    """
    path = Path(path)
    if is_legacy(path):
        return load_checkpoint(path, device)[0]
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"checkpoint {path}: missing or incomplete (no {MARKER} marker, no {MODEL_FILE}); "
                                f"it was not completely written")
    from torch.distributed.checkpoint import CheckpointException

    from lf_parallel import UnsafeCheckpointError, read_full_tensors

    try:
        tensors = read_full_tensors(path, prefix="model." + PREFIX)  # DCP's model namespace, then the trainer's
    except UnsafeCheckpointError:  # names the file and the class it refused; not damage to delete
        raise
    except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
        raise damaged(path, "the DCP shards", err, plural=True) from None
    if not tensors:
        raise damaged(path, "the DCP shards", f"no model tensors under {PREFIX!r}", plural=True)
    weights = {k: v.to(device) for k, v in tensors.items()}
    check_finite_state(path, "the DCP shards", weights, plural=True)
    return weights
