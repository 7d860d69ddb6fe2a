"""LeRobotDataset's ``tasks`` and ``max_frames`` selection on synthetic episodes (no simulator needed)."""

from __future__ import annotations

import numpy as np
import pytest

from lf_data import LeRobotDataset, write_lerobot_v3

FEATURES = {
    "observation.image": {"dtype": "image", "shape": [4, 4, 3], "names": ["height", "width", "channels"]},
    "observation.state": {"dtype": "float32", "shape": [2], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": None},
}
TASKS = ["go left", "go right", "stay"]


@pytest.fixture
def written(tmp_path):
    """Five episodes of lengths 5, 3, 6, 2, 4 with tasks left, right, left, stay, right; actions are random."""
    rng = np.random.default_rng(0)
    eps = []
    for n, task in zip([5, 3, 6, 2, 4], ["go left", "go right", "go left", "stay", "go right"], strict=True):
        eps.append({"task": task, "frames": {
            "observation.image": rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8),
            "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
            "action": rng.normal(size=(n, 2)).astype(np.float32)}})
    return write_lerobot_v3(tmp_path / "ds", eps, fps=10, features=FEATURES), eps


def test_tasks_keep_only_their_episodes(written):
    """Oracle: the writer's input: tasks ['go right', 'stay'] keep episodes 1, 3, 4 (dataset order), frame for
    frame; the task list and indices stay the dataset's."""
    root, eps = written
    ds = LeRobotDataset(root, tasks=["stay", "go right"])
    assert ds.tasks == TASKS and ds.num_episodes == 3 and ds.episode_ranges == [(0, 3), (3, 5), (5, 9)]
    got = [(ds[i]["episode_index"], ds[i]["frame_index"], ds[i]["task"]) for i in range(len(ds))]
    assert got == [(e, t, eps[e]["task"]) for e in (1, 3, 4) for t in range(len(eps[e]["frames"]["action"]))]
    np.testing.assert_array_equal(ds[3]["actions"][0].numpy(), eps[3]["frames"]["action"][0])


def test_max_frames_cuts_episodes_and_pads_at_the_cut(written):
    """Oracle: the writer's input cut to its first 4 frames per episode; the chunk of the last kept frame repeats
    that frame's action and is padded past it (the cut is an episode end)."""
    root, eps = written
    ds = LeRobotDataset(root, max_frames=4, action_horizon=3, episodes=[2, 1], tasks=["go left", "go right"])
    assert ds.episode_ranges == [(0, 4), (4, 7)] and len(ds) == 7
    last = ds[3]  # frame 3 of episode 2, which has 6 frames
    assert (last["episode_index"], last["frame_index"]) == (2, 3)
    assert last["action_is_pad"].tolist() == [False, True, True]
    np.testing.assert_array_equal(last["actions"].numpy(), np.repeat(eps[2]["frames"]["action"][3:4], 3, 0))
    inner = ds[1]  # frame 1 of episode 2: a full chunk of frames 1..3
    np.testing.assert_array_equal(inner["actions"].numpy(), eps[2]["frames"]["action"][1:4])
    assert LeRobotDataset(root, max_frames=100).episode_ranges == LeRobotDataset(root).episode_ranges


def test_unknown_task_and_bad_max_frames_are_refused(written):
    """Oracle: the contract: the message names the task, the dataset folder and lists the dataset's tasks."""
    root, _ = written
    with pytest.raises(ValueError, match=r"ds: task 'go up' is not in the dataset "
                                         r"\(its tasks: 'go left', 'go right', 'stay'\)"):
        LeRobotDataset(root, tasks=["go left", "go up"])
    with pytest.raises(ValueError, match=r"ds: task 'stay' has no episode among the selected 2"):
        LeRobotDataset(root, tasks=["stay"], episodes=[0, 1])
    with pytest.raises(ValueError, match="max_frames must be >= 1.*got 0"):
        LeRobotDataset(root, max_frames=0)
