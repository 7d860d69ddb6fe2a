"""convert_dataset that fails midway leaves nothing behind, so the retry works.

Oracle: the folder listing of the destination's parent (no ``dst``, no temporary
sibling) after an episode whose parquet pages are corrupt (its footer intact, so
the failure comes only when episode 2 is read, after episodes 0 and 1 were written).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("av")

from lf_data import LeRobotDataset  # noqa: E402
from lf_data._inspect import convert_dataset  # noqa: E402
from lf_data._lerobot_video_writer import write_lerobot_video  # noqa: E402

CAM = "observation.images.top"
FEATURES = {CAM: {"dtype": "video", "shape": [8, 8, 3]}, "observation.state": {"dtype": "float32", "shape": [2]},
            "action": {"dtype": "float32", "shape": [2]}}


def v21_with_corrupt_last_episode(folder):
    """A LeRobot v2.1 dataset of 3 episodes (4, 6, 5 frames); episode 2's parquet pages overwritten.

    Returns ``(root, corrupt_file, its original bytes)``.
    """
    rng = np.random.default_rng(0)
    eps = [{"task": "stack the cups", "frames": {CAM: rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                                                 "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
                                                 "action": rng.normal(size=(n, 2)).astype(np.float32)}}
           for n in (4, 6, 5)]
    root = write_lerobot_video(folder / "v21", eps, version="v2.1", fps=15, features=FEATURES)
    path = root / "data/chunk-000/episode_000002.parquet"
    good = path.read_bytes()
    bad = bytearray(good)
    bad[4:300] = b"\xff" * 296  # the page headers after the "PAR1" magic; the footer stays readable
    path.write_bytes(bytes(bad))
    return root, path, good


def test_failed_convert_leaves_no_partial_folder(tmp_path):
    """The failing conversion raises naming the file and leaves no dst (was: data file, no meta/); the retry works."""
    root, path, good = v21_with_corrupt_last_episode(tmp_path)
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    with pytest.raises(ValueError, match=r"episode_000002\.parquet"):
        convert_dataset(root, out_parent / "v3")
    assert list(out_parent.iterdir()) == []
    path.write_bytes(good)
    assert convert_dataset(root, out_parent / "v3")["episodes"] == 3
    assert len(LeRobotDataset(out_parent / "v3", image_key=CAM)) == 15
    assert sorted(p.name for p in out_parent.iterdir()) == ["v3"]


def test_failed_convert_into_empty_folder_keeps_it_empty(tmp_path):
    """An existing empty dst stays (empty) after a failure and is filled by the retry."""
    root, path, good = v21_with_corrupt_last_episode(tmp_path)
    dst = tmp_path / "v3"
    dst.mkdir()
    with pytest.raises(ValueError, match=r"cannot read parquet"):
        convert_dataset(root, dst)
    assert dst.is_dir() and list(dst.iterdir()) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    path.write_bytes(good)
    assert convert_dataset(root, dst)["episodes"] == 3
    assert (dst / "meta/info.json").is_file()
