"""Shared fixtures: one tiny Meta-World dataset per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MUJOCO_GL", "osmesa")
# Tests import metaworld directly (pytest.importorskip), before lf_data.import_sim would load
# Triton ahead of OSMesa's LLVM: do that first here too (see _mw_env._load_triton_before_osmesa).
from lf_data._mw_env import _load_triton_before_osmesa  # noqa: E402

_load_triton_before_osmesa()

TASKS = ["reach-v3", "push-v3"]
EPISODES = 2
IMAGE = 32


@pytest.fixture(scope="session")
def mw_dataset(tmp_path_factory):
    """reach-v3 + push-v3, 2 episodes each, 32x32 images, 2 spawn workers."""
    pytest.importorskip("metaworld")
    from lf_data import generate_metaworld

    out = tmp_path_factory.mktemp("mw") / "ds"
    calls = []
    path = generate_metaworld(out, tasks=TASKS, episodes_per_task=EPISODES, image_size=IMAGE, workers=2,
                              progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (len(TASKS) * EPISODES, len(TASKS) * EPISODES)
    return path
