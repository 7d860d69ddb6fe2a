"""Damaged checkpoint files fail with a message naming the file and the way out, never a raw traceback.

Oracle: the contract of the checkpoint readers (``CheckpointError`` naming the folder and file and suggesting
to delete the folder; no advice to unpickle without ``weights_only``; ``FileNotFoundError`` naming a missing
file), on DCP folders written by ``FamilyCheckpointer`` (the layout every trainer writes) and on folders of
the legacy full-state layout, each damaged in several ways; intact folders load back the saved tensors.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lf_orchestrator.checkpoint import (
    MODEL_FILE,
    STATE_FILE,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    load_weights,
)
from lf_orchestrator.families._state import TRAIN_STATE_FILE, FamilyCheckpointer

W = torch.arange(6, dtype=torch.float32).reshape(2, 3)


def _loss_module(weight: torch.Tensor) -> nn.Module:
    """A trainer's state module: the recipe model under ``model``."""
    loss = nn.Module()
    loss.model = nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        loss.model.weight.copy_(weight)
    return loss


def _dcp(tmp_path, weight=W):
    module = _loss_module(weight)
    opt = torch.optim.AdamW(module.parameters())
    return FamilyCheckpointer(tmp_path, distributed=False, keep=2).save(3, module, opt, {"step": 3}, "dp=1")


def _load_dcp(path):
    module = _loss_module(torch.zeros(2, 3))
    return FamilyCheckpointer(path.parent.parent, distributed=False, keep=2).load(
        path, module, torch.optim.AdamW(module.parameters())), module


def test_intact_dcp_checkpoint_loads(tmp_path):
    path = _dcp(tmp_path)
    assert latest_checkpoint(tmp_path) == path
    assert torch.equal(load_weights(path)["weight"], W)
    (state, extra), module = _load_dcp(path)
    assert state["step"] == 3 and extra["step"] == 3 and torch.equal(module.model.weight.detach(), W)


def test_truncated_dcp_shard_names_the_shards(tmp_path):
    path = _dcp(tmp_path)
    (shard,) = path.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:40])
    for load in (load_weights, _load_dcp):
        with pytest.raises(CheckpointError, match=rf"checkpoint .*{path.name}: "
                                                  r"the DCP shards are damaged .*delete"):
            load(path)


def test_garbage_dcp_metadata_names_the_shards(tmp_path):
    path = _dcp(tmp_path)
    (path / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(CheckpointError, match="the DCP shards are damaged") as err:
        load_weights(path)
    assert "weights_only" not in str(err.value)


def test_garbage_train_state_gives_no_unsafe_advice(tmp_path):
    path = _dcp(tmp_path)
    (path / TRAIN_STATE_FILE).write_bytes(b"\x80\x04not a checkpoint at all")
    with pytest.raises(CheckpointError) as err:
        _load_dcp(path)
    assert f"{TRAIN_STATE_FILE} is damaged" in str(err.value) and "weights_only" not in str(err.value)


def test_missing_train_state_and_marker_are_named(tmp_path):
    path = _dcp(tmp_path)
    (path / TRAIN_STATE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=f"missing {TRAIN_STATE_FILE}"):
        _load_dcp(path)
    (path / ".lf_complete").unlink()
    assert latest_checkpoint(tmp_path) is None  # an unmarked folder is never taken
    with pytest.raises(FileNotFoundError, match="incomplete"):
        load_weights(path)


def test_non_finite_dcp_weights_are_refused(tmp_path):
    path = _dcp(tmp_path, torch.full((2, 3), math.nan))
    with pytest.raises(CheckpointError, match="tensor 'weight' holds NaN or inf"):
        load_weights(path)


def _legacy(tmp_path):
    """A folder as lf-orchestrator 0.3 wrote it (``model.safetensors`` + ``state.pt``)."""
    from safetensors.torch import save_file

    path = tmp_path / "checkpoints" / "step-00000003"
    path.mkdir(parents=True)
    save_file({"w": W, "b": torch.ones(3)}, str(path / MODEL_FILE))
    torch.save({"step": 3}, path / STATE_FILE)
    return path


def test_intact_legacy_checkpoint_loads(tmp_path):
    path = _legacy(tmp_path)
    assert latest_checkpoint(tmp_path) == path
    model, train = load_checkpoint(path)
    assert torch.equal(model["w"], W) and train["step"] == 3 and torch.equal(load_weights(path)["w"], W)


def test_truncated_legacy_weights_name_the_file(tmp_path):
    path = _legacy(tmp_path)
    data = (path / MODEL_FILE).read_bytes()
    (path / MODEL_FILE).write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=rf"checkpoint .*{path.name}: {MODEL_FILE} is damaged .*delete"):
        load_weights(path)


def test_garbage_legacy_state_gives_no_unsafe_advice(tmp_path):
    path = _legacy(tmp_path)
    (path / STATE_FILE).write_bytes(b"\x80\x04not a checkpoint at all")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert f"{STATE_FILE} is damaged" in str(err.value) and "weights_only" not in str(err.value)


def test_non_finite_legacy_weights_are_refused(tmp_path):
    path = _legacy(tmp_path)
    from safetensors.torch import save_file

    save_file({"w": torch.full((2, 3), math.nan), "b": torch.ones(3)}, str(path / MODEL_FILE))
    with pytest.raises(CheckpointError, match="tensor 'w' holds NaN or inf"):
        load_weights(path)
