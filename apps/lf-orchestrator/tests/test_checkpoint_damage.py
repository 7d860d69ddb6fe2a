"""Damaged checkpoint files fail with a message naming the file and the way out, never a raw traceback.

Oracle: the contract of ``load_checkpoint`` (CheckpointError naming the folder and file, suggesting to
delete the folder; no advice to unpickle without ``weights_only``), on files damaged in three ways.
"""

from __future__ import annotations

import math

import pytest
import torch

from lf_orchestrator.checkpoint import MODEL_FILE, STATE_FILE, CheckpointError, load_checkpoint, save_checkpoint


def _checkpoint(tmp_path):
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
    return save_checkpoint(tmp_path, 3, state, {"step": 3}, keep=2)


def test_intact_checkpoint_loads(tmp_path):
    model, train = load_checkpoint(_checkpoint(tmp_path))
    assert torch.equal(model["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3)) and train["step"] == 3


def test_truncated_weights_name_the_file(tmp_path):
    path = _checkpoint(tmp_path)
    data = (path / MODEL_FILE).read_bytes()
    (path / MODEL_FILE).write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=rf"checkpoint .*{path.name}: {MODEL_FILE} is damaged .*delete"):
        load_checkpoint(path)


def test_garbage_state_gives_no_unsafe_advice(tmp_path):
    path = _checkpoint(tmp_path)
    (path / STATE_FILE).write_bytes(b"\x80\x04not a checkpoint at all")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert f"{STATE_FILE} is damaged" in str(err.value) and "weights_only" not in str(err.value)


def test_non_finite_weights_are_refused(tmp_path):
    path = _checkpoint(tmp_path)
    from safetensors.torch import save_file

    save_file({"w": torch.full((2, 3), math.nan), "b": torch.ones(3)}, str(path / MODEL_FILE))
    with pytest.raises(CheckpointError, match="tensor 'w' holds NaN or inf"):
        load_checkpoint(path)
