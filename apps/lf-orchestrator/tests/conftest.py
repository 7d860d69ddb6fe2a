"""Shared fixtures: one tiny Meta-World dataset per test session and a tiny run config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MUJOCO_GL", "osmesa")
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 set, which a plain pytest run does not have: the consoles
# built at import (make_console) would then wrap messages at 80 columns instead of the redirected width, and tests
# that match a printed message fail only under `-n`.
if "PYTEST_XDIST_WORKER" in os.environ:
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

TINY = """
[run]
name = "tiny"
out_dir = "{out}"
device = "cpu"
threads = 2

[data]
source = "metaworld"
path = "{data}"
tasks = ["reach-v3"]
episodes_per_task = 3
image_size = 32
max_steps = 60
workers = 1
action_horizon = 2
max_instruction_len = 6

[model]
size = "tiny"
overrides = {{ patch_size = 8 }}

[train]
steps = 6
global_batch = 8
lr = 3e-3
warmup_steps = 2
log_every = 1
ckpt_every = 3

[parallel]
plan = "auto"
micro_batch = 4

[eval]
episodes = 2
max_steps = 20
"""


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread (and share the machine better); the count is restored afterwards.
    Modules that want it set ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory) -> Path:
    from lf_data import generate_metaworld

    path = tmp_path_factory.mktemp("data") / "reach"
    generate_metaworld(path, tasks=["reach-v3"], episodes_per_task=3, image_size=32,
                       max_steps=60, seed=0, workers=1)
    return path


@pytest.fixture
def tiny_config(tmp_path, dataset_dir) -> Path:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY.format(out=tmp_path / "runs", data=dataset_dir))
    return cfg


@pytest.fixture(scope="session")
def vla_run(dataset_dir, tmp_path_factory) -> Path:
    """A 2-step VLA run folder written by `lf run` (one DCP checkpoint at step 2, no evaluation), shared by the
    session: tests that change it work on copies."""
    from typer.testing import CliRunner

    from lf_orchestrator.cli import app
    from lf_orchestrator.config import load_config

    base = tmp_path_factory.mktemp("vla")
    cfg = base / "tiny.toml"
    cfg.write_text(TINY.format(out=base / "runs", data=dataset_dir))
    sets = ["train.steps=2", "train.ckpt_every=2", "eval.at_end=false", "run.threads=1"]
    result = CliRunner().invoke(app, ["run", str(cfg), *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    (run,) = [p for p in Path(load_config(cfg).run.out_dir).iterdir() if p.is_dir()]
    return run
