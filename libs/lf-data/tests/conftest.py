"""Shared fixtures: one tiny Meta-World dataset per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MUJOCO_GL", "osmesa")

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
