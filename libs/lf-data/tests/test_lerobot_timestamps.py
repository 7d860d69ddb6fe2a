"""Timestamps off the frame grid ``frame_index / fps``: refused by name instead of shifting video frames.

Datasets are written by lf's own writers (``write_lerobot_video``: lossless mp4, so a decoded frame equals the
written one exactly; ``write_lerobot_v3``: PNG in parquet), then one timestamp is corrupted in place.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("av")

from test_lerobot_video import CAM, FEATURES, LENGTHS, _episodes  # noqa: E402

from lf_data import LeRobotDataset, write_lerobot_v3  # noqa: E402
from lf_data._errors import DataError  # noqa: E402
from lf_data._inspect import inspect_dataset  # noqa: E402
from lf_data._lerobot_stream import LeRobotStream  # noqa: E402
from lf_data._lerobot_time import check_frame_timestamps  # noqa: E402
from lf_data._lerobot_video_writer import write_lerobot_video  # noqa: E402

FPS = 10
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
DATA_FILE = "data/chunk-000/file-000.parquet"


def _set_cell(path, column: str, row: int, value: float) -> None:
    table = pq.read_table(path)
    values = table[column].to_pylist()
    values[row] = value
    i = table.column_names.index(column)
    pq.write_table(table.set_column(i, table.field(i), pa.array(values, table.field(i).type)), path)


@pytest.fixture
def v30(tmp_path):
    eps = _episodes()
    return write_lerobot_video(tmp_path / "ds", eps, version="v3.0", fps=FPS, features=FEATURES), eps


def _images_match_written(samples: list[dict], eps: list[dict]) -> None:
    for s in samples:
        want = eps[s["episode_index"]]["frames"][CAM][s["frame_index"]]
        np.testing.assert_array_equal(s["image"].numpy(), want,
                                      err_msg=f"episode {s['episode_index']} frame {s['frame_index']}")


@pytest.mark.parametrize("frames_off", [0.6, 0.3, 1.0])
def test_from_timestamp_off_grid_is_refused_not_shifted(v30, frames_off):
    """Oracle: the frames written to the lossless mp4. Episode 0's ``from_timestamp`` moved by 0.6 frame made
    every frame of it the next one (its last sample showed episode 1's first image) with no error; 0.3 frame is
    past the tolerance though it still rounds right; a whole frame is seen through ``to_timestamp``. Now the
    episode is refused (naming the metadata file, episode, frame and drift) or skipped, and the others read
    exactly."""
    root, eps = v30
    _set_cell(root / EPISODES_FILE, f"videos/{CAM}/from_timestamp", 0, frames_off / FPS)
    ds = LeRobotStream(root, on_error="skip")
    samples = list(ds)
    _images_match_written(samples, eps)
    assert ds.skipped == {"timestamp": 1} and {s["episode_index"] for s in samples} == {1, 2}
    with pytest.raises(DataError) as err:
        LeRobotStream(root)
    msg = str(err.value)
    assert str(root / EPISODES_FILE) in msg and "episode 0, frame " in msg
    assert (err.value.episode, err.value.reason) == (0, "timestamp")
    if frames_off != 1.0:
        assert f"videos/{CAM}/from_timestamp" in msg and f"{frames_off / FPS - round(frames_off) / FPS:+.6f} s" in msg
    else:
        assert "to_timestamp - from_timestamp" in msg and "-0.100000 s" in msg


def test_tolerance_is_configurable(v30):
    """Oracle: the written frames: a 2e-4 s drift is refused at LeRobot's 1e-4 s, read exactly at 1e-3 s."""
    root, eps = v30
    _set_cell(root / EPISODES_FILE, f"videos/{CAM}/from_timestamp", 1, LENGTHS[0] / FPS + 2e-4)
    with pytest.raises(DataError, match=r"episode 1, frame 0: .* \+0\.000200 s off the frame grid"):
        LeRobotStream(root)
    _images_match_written(list(LeRobotStream(root, tolerance_s=1e-3)), eps)
    with pytest.raises(ValueError, match="tolerance_s: expected a finite number of seconds >= 0, got -1"):
        LeRobotStream(root, tolerance_s=-1)


def test_frame_timestamp_off_grid_names_file_episode_frame(v30, tmp_path):
    """Oracle: the frame grid frame_index / fps; one frame's stored ``timestamp`` 0.05 s late (where LeRobot would
    look up another video frame) is named by data file, episode, frame and drift in both readers."""
    root, _ = v30
    row = LENGTHS[0] + 3  # episode 1, frame 3
    _set_cell(root / DATA_FILE, "timestamp", row, 0.35)
    with pytest.raises(DataError) as err:
        list(LeRobotStream(root))
    msg = str(err.value)
    assert msg.startswith(f"{root / DATA_FILE}: episode 1, frame 3: timestamp 0.350000 s is +0.050000 s off")
    assert err.value.record == 3 and err.value.field == "timestamp"
    ds = LeRobotStream(root, on_error="skip")
    assert {s["episode_index"] for s in ds} == {0, 2} and ds.skipped == {"timestamp": 1}

    images = write_lerobot_v3(tmp_path / "png", [{"task": e["task"], "frames": {
        "observation.image": e["frames"][CAM], "observation.state": e["frames"]["observation.state"],
        "action": e["frames"]["action"]}} for e in _episodes()], fps=FPS, features={
        "observation.image": {"dtype": "image", "shape": [16, 16, 3]},
        "observation.state": {"dtype": "float32", "shape": [3]}, "action": {"dtype": "float32", "shape": [2]}})
    assert len(LeRobotDataset(images)) == sum(LENGTHS)
    _set_cell(images / DATA_FILE, "timestamp", row, 0.35)
    with pytest.raises(DataError, match=r"file-000.parquet: episode 1, frame 3: timestamp 0.350000 s is "
                                        r"\+0.050000 s off the frame grid .*1 frame drift, in episode 1$"):
        LeRobotDataset(images)
    assert len(LeRobotDataset(images, tolerance_s=0.06)) == sum(LENGTHS)


def test_float32_timestamps_of_long_episodes_pass():
    """Oracle: float32(frame_index / fps) as LeRobot stores it, for a 2-hour episode at 30 fps (the float32
    spacing there, 2.4e-4 s, is above the 1e-4 s tolerance); one spacing more is refused."""
    frames = np.arange(0, 30 * 7200, 7)
    ts = (frames / 30).astype(np.float32)
    check_frame_timestamps(ts, frames, np.zeros_like(frames), 30, 1e-4, file="x.parquet")
    ts[-1] = np.nextafter(np.nextafter(ts[-1], np.float32(1e9)), np.float32(1e9))
    with pytest.raises(DataError, match=f"x.parquet: episode 0, frame {frames[-1]}: "):
        check_frame_timestamps(ts, frames, np.zeros_like(frames), 30, 1e-4, file="x.parquet")


def test_inspect_lists_episodes_off_the_grid(v30):
    """Oracle: the corrupted cells: inspect reports episode 0 (from_timestamp) and episode 2 (a frame's
    timestamp) as problems, skipped for reason "timestamp"."""
    root, _ = v30
    _set_cell(root / EPISODES_FILE, f"videos/{CAM}/from_timestamp", 0, 0.06)
    _set_cell(root / DATA_FILE, "timestamp", sum(LENGTHS) - 1, 0.0)
    rep = inspect_dataset(root)
    assert rep["skipped"] == {"timestamp": 2}
    assert any("episode 0, frame 0: " in p and "from_timestamp" in p for p in rep["problems"])
    assert any(f"episode 2, frame {LENGTHS[2] - 1}: timestamp 0.000000 s" in p for p in rep["problems"])
