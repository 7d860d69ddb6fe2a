"""``data.source = "lerobot"``: ``data.tasks`` and ``data.max_steps`` select what the VLA and the other families
read. Oracle: the episodes given to ``lf_data.write_lerobot_v3`` in the test (tasks, lengths, actions)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from lf_data import METAWORLD_INSTRUCTIONS, LeRobotDataset, write_lerobot_v3
from lf_orchestrator.cli import app
from lf_orchestrator.config import ConfigError, load_config
from lf_orchestrator.families._metaworld import dataset_selection, open_dataset

REACH, PUSH = METAWORLD_INSTRUCTIONS["reach-v3"], METAWORLD_INSTRUCTIONS["push-v3"]
TASKS = [REACH, PUSH, "wave at the camera"]
LENGTHS = [7, 5, 9, 3, 8, 6]
"""Episode e has LENGTHS[e] frames and task TASKS[e % 3]."""


@pytest.fixture(scope="module")
def lerobot_dir(tmp_path_factory):
    """Six Meta-World-shaped episodes (32 x 32 images, 39 state values, 4 actions) of three tasks."""
    rng = np.random.default_rng(0)
    features = {"observation.image": {"dtype": "image", "shape": [32, 32, 3], "names": ["height", "width", "channels"]},
                "observation.state": {"dtype": "float32", "shape": [39], "names": None},
                "action": {"dtype": "float32", "shape": [4], "names": None}}
    episodes = [{"task": TASKS[e % 3], "frames": {
        "observation.image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(n, 39)).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, 4)).astype(np.float32)}} for e, n in enumerate(LENGTHS)]
    return write_lerobot_v3(tmp_path_factory.mktemp("lerobot") / "ds", episodes, fps=10, features=features)


def _cfg(tiny_config, path, *sets):
    return load_config(tiny_config, ["data.source='lerobot'", f"data.path='{path}'", *sets])


def _episodes(ds) -> list[tuple[int, int, str]]:
    """(episode index, frames, task) of every episode the dataset reads."""
    return [(ds[a]["episode_index"], b - a, ds[a]["task"]) for a, b in ds.episode_ranges]


def test_tasks_and_max_steps_select_episodes_for_the_trainer_and_families(tiny_config, lerobot_dir):
    """A Meta-World name stands for its instruction, a dataset task string for itself; episodes keep their first
    data.max_steps = 6 frames; the VLA family (open_dataset with its action horizon), the other families
    (open_dataset) and the BC baseline (dataset_selection) read the same episodes, and the last kept frame's action
    chunk is padded at the cut."""
    cfg = _cfg(tiny_config, lerobot_dir, "data.tasks=['reach-v3', 'wave at the camera']", "data.max_steps=6",
               "data.action_horizon=2")
    assert dataset_selection(cfg) == {"tasks": [REACH, "wave at the camera"], "max_frames": 6}
    want = [(e, min(n, 6), TASKS[e % 3]) for e, n in enumerate(LENGTHS) if e % 3 != 1]
    vla = open_dataset(cfg, generate=False, action_horizon=cfg.data.action_horizon)
    assert _episodes(vla) == want == _episodes(open_dataset(cfg, generate=False))
    assert vla.tasks == TASKS  # indices (and the instruction vocabulary) stay the dataset's
    whole = LeRobotDataset(lerobot_dir, action_horizon=2)
    cut = vla[vla.episode_ranges[0][1] - 1]  # frame 5 of episode 0 (7 frames, cut to 6)
    assert cut["frame_index"] == 5 and cut["action_is_pad"].tolist() == [False, True]
    assert whole[5]["action_is_pad"].tolist() == [False, False]
    np.testing.assert_array_equal(cut["actions"].numpy(), np.repeat(whole[5]["actions"][:1].numpy(), 2, 0))


def test_metaworld_source_reads_its_generated_dataset_whole(tiny_config):
    """data.source = "metaworld": the dataset is generated from these settings, so nothing is selected."""
    assert dataset_selection(load_config(tiny_config)) == {}


def test_a_task_not_in_the_dataset_is_refused_by_name(tiny_config, lerobot_dir, tmp_path):
    """The message names the data.tasks entry (and a Meta-World name's instruction) and lists the dataset's tasks;
    `lf run` exits 2 with it before training."""
    cfg = _cfg(tiny_config, lerobot_dir, "data.tasks=['reach-v3', 'drawer-close-v3']")
    listed = f"it has 3: {REACH!r}, {PUSH!r}, 'wave at the camera'"
    with pytest.raises(ConfigError, match="data.tasks: 'drawer-close-v3' \\(instruction 'push the drawer closed'\\)"
                                          " is not a task of the LeRobot dataset at") as err:
        dataset_selection(cfg)
    assert listed in str(err.value)
    out = CliRunner().invoke(app, ["run", str(tiny_config), "--set", "data.source='lerobot'",
                                   "--set", f"data.path='{lerobot_dir}'", "--set", "data.tasks=['pick the apple']",
                                   "--set", f"run.out_dir='{tmp_path / 'runs'}'"])
    assert out.exit_code == 2, out.output
    assert "data.tasks: 'pick the apple' is not a task of the LeRobot dataset" in out.output
    assert listed in " ".join(out.output.split())


def test_star_selects_every_task_of_the_dataset(tiny_config, lerobot_dir):
    """data.tasks = ['*'] with a LeRobot dataset reads all three tasks' episodes (the same as naming them); '*' with
    other names, or with data.source = 'metaworld' (which generates by name), is refused naming data.tasks."""
    star = _cfg(tiny_config, lerobot_dir, "data.tasks=['*']", "data.max_steps=6", "data.action_horizon=2")
    named = _cfg(tiny_config, lerobot_dir, f"data.tasks={TASKS!r}", "data.max_steps=6", "data.action_horizon=2")
    assert dataset_selection(star) == dataset_selection(named) == {"tasks": TASKS, "max_frames": 6}
    assert _episodes(open_dataset(star, generate=False)) == [(e, min(n, 6), TASKS[e % 3])
                                                             for e, n in enumerate(LENGTHS)]
    for sets in (["data.tasks=['*', 'reach-v3']"], []):
        with pytest.raises(ConfigError, match=r"data.tasks: expected \['\*'\] alone, with data.source = 'lerobot'"):
            load_config(tiny_config, ["data.tasks=['*']", *sets] if sets else ["data.tasks=['*']"])


def test_lf_eval_of_a_star_run_rolls_out_the_datasets_meta_world_tasks(tiny_config, lerobot_dir, dataset_dir):
    """`lf eval` of a data.tasks = ['*'] run: a dataset of Meta-World instructions gives their task names; one with
    another task ('wave at the camera') is refused naming it; --tasks wins over data.tasks."""
    from lf_orchestrator.families.vla.evaluate import eval_tasks

    assert eval_tasks(_cfg(tiny_config, dataset_dir, "data.tasks=['*']")) == ["reach-v3"]
    with pytest.raises(ValueError, match="not Meta-World instructions \\('wave at the camera', ...\\)"):
        eval_tasks(_cfg(tiny_config, lerobot_dir, "data.tasks=['*']"))
    assert eval_tasks(_cfg(tiny_config, lerobot_dir, "data.tasks=['*']"), ["push-v3"]) == ["push-v3"]
