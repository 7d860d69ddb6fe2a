"""LeRobot v3.0 writer/reader round trip on synthetic episodes (no simulator needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lf_data import LeRobotDataset, compute_stats, write_lerobot_v3
from lf_data._stats import image_stats_from_histograms, pixel_histograms

FEATURES = {
    "observation.image": {"dtype": "image", "shape": [6, 5, 3], "names": ["height", "width", "channels"]},
    "observation.state": {"dtype": "float32", "shape": [3], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": None},
}


def _episodes(lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for e, n in enumerate(lengths):
        out.append({"task": ["go left", "go right"][e % 2], "frames": {
            "observation.image": rng.integers(0, 256, (n, 6, 5, 3), dtype=np.uint8),
            "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
            "action": rng.normal(size=(n, 2)).astype(np.float32)}})
    return out


@pytest.fixture
def synth(tmp_path):
    eps = _episodes([4, 7, 3])
    return write_lerobot_v3(tmp_path / "ds", eps, fps=10, features=FEATURES, tasks=["go right"]), eps


def test_round_trip_equals_input(synth):
    """Oracle: the arrays given to the writer (PNG is lossless)."""
    root, eps = synth
    for preload in (1 << 30, 0):  # decoded at init, or per item
        ds = LeRobotDataset(root, action_horizon=2, preload_max_bytes=preload)
        assert len(ds) == 14 and ds.num_episodes == 3 and ds.fps == 10
        assert ds.tasks == ["go right", "go left"]  # registered first, then first seen
        assert ds.episode_ranges == [(0, 4), (4, 11), (11, 14)]
        i = 0
        for e, ep in enumerate(eps):
            f = ep["frames"]
            for t in range(len(f["action"])):
                item = ds[i]
                np.testing.assert_array_equal(item["image"].numpy(), f["observation.image"][t])
                np.testing.assert_array_equal(item["state"].numpy(), f["observation.state"][t])
                np.testing.assert_array_equal(item["actions"][0].numpy(), f["action"][t])
                assert (item["task"], item["episode_index"], item["frame_index"]) == (ep["task"], e, t)
                assert item["task_index"] == ds.tasks.index(ep["task"])
                i += 1


def test_episode_subset(synth):
    """Oracle: the writer's input for episodes 2 then 0 (order kept)."""
    root, eps = synth
    ds = LeRobotDataset(root, episodes=[2, 0], action_horizon=5)
    assert len(ds) == 7 and ds.episode_ranges == [(0, 3), (3, 7)] and ds.num_episodes == 2
    item = ds[2]  # last frame of episode 2
    assert (item["episode_index"], item["frame_index"]) == (2, 2)
    assert item["action_is_pad"].tolist() == [False, True, True, True, True]
    np.testing.assert_array_equal(item["actions"].numpy(), np.repeat(eps[2]["frames"]["action"][-1:], 5, 0))
    with pytest.raises(ValueError, match="episodes"):
        LeRobotDataset(root, episodes=[5])
    with pytest.raises(IndexError):
        ds[7]


def test_wrong_codebase_version_names_file(synth):
    """Oracle: the message must name meta/info.json, the field and the value."""
    root, _ = synth
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["codebase_version"] = "v2.1"
    info_path.write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"meta/info\.json.*'codebase_version' is 'v2\.1'"):
        LeRobotDataset(root)


def test_missing_and_corrupt_files_are_named(synth):
    """Oracle: the path of the damaged file appears in the error."""
    root, _ = synth
    (root / "meta/stats.json").rename(root / "meta/stats.bak")
    with pytest.raises(FileNotFoundError, match=r"meta/stats\.json"):
        LeRobotDataset(root)
    (root / "meta/stats.bak").rename(root / "meta/stats.json")
    data = root / "data/chunk-000/file-000.parquet"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"data/chunk-000/file-000\.parquet"):
        LeRobotDataset(root)


def test_writer_validates_and_rolls_files(tmp_path):
    """Oracle: feature specs; a tiny file-size limit gives one data file per episode."""
    bad = _episodes([3])
    bad[0]["frames"]["action"] = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match="'action' has shape"):
        write_lerobot_v3(tmp_path / "a", bad, fps=10, features=FEATURES)
    root = write_lerobot_v3(tmp_path / "b", _episodes([2, 3, 4]), fps=10, features=FEATURES,
                            data_files_size_in_mb=0, chunks_size=2)
    files = sorted(p.relative_to(root).as_posix() for p in (root / "data").glob("*/*.parquet"))
    assert files == ["data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet",
                     "data/chunk-001/file-000.parquet"]
    assert len(LeRobotDataset(root)) == 9
    with pytest.raises(FileExistsError):
        write_lerobot_v3(root, _episodes([1]), fps=10, features=FEATURES)


def test_compute_stats_hand_example():
    """Oracle: values worked out by hand."""
    s = compute_stats(np.array([[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]]))
    assert s["mean"] == [2.0, 1.0] and s["min"] == [0.0, 1.0] and s["max"] == [4.0, 1.0]
    np.testing.assert_allclose(s["std"], [np.sqrt(8 / 3), 0.0])
    np.testing.assert_allclose(s["q01"], [0.04, 1.0]) and np.testing.assert_allclose(s["q99"], [3.96, 1.0])
    assert s["count"] == [3]
    with pytest.raises(ValueError, match="N=0"):
        compute_stats(np.zeros((0, 2)))


def test_image_stats_from_histograms_equal_direct():
    """Oracle: compute_stats over every pixel of each channel, / 255."""
    imgs = np.random.default_rng(1).integers(0, 256, (7, 5, 4, 3), dtype=np.uint8)
    got = image_stats_from_histograms(pixel_histograms(imgs), 7)
    ref = compute_stats(imgs.reshape(-1, 3) / 255.0)
    for k in ["mean", "std", "min", "max", "q01", "q99"]:
        np.testing.assert_allclose(np.array(got[k]).reshape(3), ref[k], rtol=1e-12, atol=1e-12, err_msg=k)
    assert np.array(got["mean"]).shape == (3, 1, 1) and got["count"] == [7]


def test_works_without_simulator():
    """Oracle: with metaworld/mujoco unimportable, imports succeed and building an env names the extra."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['metaworld'] = None; sys.modules['mujoco'] = None\n"
            "from lf_data import LeRobotDataset, MetaWorldEnv, generate_metaworld, METAWORLD_INSTRUCTIONS\n"
            "try:\n    MetaWorldEnv('reach-v3')\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'lf-data[sim]'" in out
