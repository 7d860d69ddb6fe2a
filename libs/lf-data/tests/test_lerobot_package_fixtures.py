"""lf-data reads LeRobot datasets written by the ``lerobot`` package itself (v2.1: lerobot 0.3.3; v3.0: 0.4.4).

Oracle: ``tests/data/lerobot_v*/written.json``, the values ``tests/data/make_lerobot_fixtures.py`` gave to
lerobot's ``LeRobotDataset.create`` / ``add_frame`` / ``save_episode``, and its ``frame_image`` function for
the camera frames (the JSON's per-frame sha256 proves they are the frames given). Parquet values (states,
actions, PNG image frames, tasks, indices) must be equal exactly. The video camera went through lerobot's
default lossy encoder (AV1 ``libsvtav1``, yuv420p, crf 30): a decoded frame must be within PSNR >= 32 dB and
mean absolute error <= 4 of the frame written (measured: >= 37.6 dB, <= 2.2) and nearer to it than to any
other frame of the dataset by >= 10 dB (measured: other frames <= 21.1 dB), so an off-by-one frame or an
episode read at the wrong offset of a shared v3.0 mp4 fails. lerobot itself is not needed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lf_data._errors import DataError
from lf_data._inspect import inspect_dataset
from lf_data._lerobot_format import task_column
from lf_data._lerobot_meta import detect_format, load_lerobot_meta
from lf_data._lerobot_reader import LeRobotDataset
from lf_data._lerobot_stream import LeRobotStream

DATA = Path(__file__).parent / "data"
VERSIONS = ["lerobot_v21", "lerobot_v30"]
FRONT, WRIST = "observation.images.front", "observation.images.wrist"
MIN_PSNR_DB, MAX_MEAN_ABS, MIN_MARGIN_DB = 32.0, 4.0, 10.0


def _frame_image():
    spec = importlib.util.spec_from_file_location("make_lerobot_fixtures", DATA / "make_lerobot_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.frame_image


frame_image = _frame_image()


@pytest.fixture(scope="module", params=VERSIONS)
def fixture(request) -> tuple[Path, dict]:
    written = json.loads((DATA / request.param / "written.json").read_text())
    return DATA / request.param / "dataset", written


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _check_video_frame(decoded: np.ndarray, episode: int, t: int, written: dict) -> None:
    want = frame_image(episode, t, 0)
    assert decoded.shape == want.shape and decoded.dtype == np.uint8
    own = _psnr(decoded, want)
    assert own >= MIN_PSNR_DB, (episode, t, own)
    assert np.abs(decoded.astype(np.float64) - want).mean() <= MAX_MEAN_ABS, (episode, t)
    others = max(_psnr(decoded, frame_image(e, u, 0)) for e, ep in enumerate(written["episodes"])
                 for u in range(ep["length"]) if (e, u) != (episode, t))
    assert own - others >= MIN_MARGIN_DB, (episode, t, own, others)


def _task_list(written: dict) -> list[str]:
    tasks: list[str] = []
    for ep in written["episodes"]:
        if ep["task"] not in tasks:
            tasks.append(ep["task"])
    return tasks


def test_fixture_frames_are_the_ones_written(fixture):
    """Oracle: the sha256 digests recorded when the frames were given to lerobot."""
    _, written = fixture
    for e, per_t in enumerate(written["frame_sha256"]):
        for t, digests in enumerate(per_t):
            assert [hashlib.sha256(frame_image(e, t, c).tobytes()).hexdigest()[:16] for c in (0, 1)] == digests


def test_metadata(fixture):
    """Oracle: written.json (version, fps, tasks in first-seen order, episode lengths and tasks)."""
    root, written = fixture
    assert detect_format(root) == f"lerobot-{written['codebase_version']}"
    meta = load_lerobot_meta(root)
    assert meta.version == written["codebase_version"] and meta.fps == written["fps"]
    assert meta.tasks == _task_list(written)
    assert [(m.index, m.length, m.tasks) for m in meta.episodes] == [
        (ep["episode_index"], ep["length"], [ep["task"]]) for ep in written["episodes"]]
    assert meta.video_keys == [FRONT] and meta.image_keys == [WRIST]


def test_stream_reads_every_value(fixture):
    """Oracle: written.json; exact for parquet values and PNG frames, codec tolerance for video frames."""
    root, written = fixture
    horizon = 3
    tasks = _task_list(written)
    ds = LeRobotStream(root, image_key=FRONT, action_horizon=horizon,
                       delta_timestamps={"observation.state": [-0.1, 0.0, 0.2], WRIST: [0.0, 0.1]})
    samples = list(ds)
    assert len(samples) == sum(ep["length"] for ep in written["episodes"])
    i = 0
    for ep in written["episodes"]:
        e, n = ep["episode_index"], ep["length"]
        state, action = np.asarray(ep["observation.state"], np.float32), np.asarray(ep["action"], np.float32)
        for t in range(n):
            s = samples[i]
            i += 1
            assert (s["episode_index"], s["frame_index"], s["task"]) == (e, ep["frame_index"][t], ep["task"])
            assert s["task_index"] == tasks.index(ep["task"])
            np.testing.assert_array_equal(s["state"].numpy(), state[t])
            want = t + np.arange(horizon)
            np.testing.assert_array_equal(s["actions"].numpy(), action[np.minimum(want, n - 1)])
            assert s["action_is_pad"].tolist() == (want >= n).tolist()
            idx = t + np.array([-1, 0, 2])
            np.testing.assert_array_equal(s["observation.state"].numpy(), state[np.clip(idx, 0, n - 1)])
            assert s["observation.state_is_pad"].tolist() == ((idx < 0) | (idx >= n)).tolist()
            wrist_idx = np.minimum(t + np.array([0, 1]), n - 1)
            np.testing.assert_array_equal(s[WRIST].numpy(), np.stack([frame_image(e, int(u), 1) for u in wrist_idx]))
            _check_video_frame(s["image"].numpy(), e, t, written)


def test_stream_png_camera_is_exact(fixture):
    """Oracle: frame_image for the PNG (lossless) camera, episodes 2 then 0 (order kept)."""
    root, written = fixture
    ds = LeRobotStream(root, image_key=WRIST, episodes=[2, 0])
    got = [(s["episode_index"], s["frame_index"], s["image"].numpy()) for s in ds]
    assert [(e, t) for e, t, _ in got] == [(e, t) for e in (2, 0) for t in range(written["episodes"][e]["length"])]
    for e, t, img in got:
        np.testing.assert_array_equal(img, frame_image(e, t, 1))


def test_episode_arrays(fixture):
    """Oracle: written.json for whole episodes, video decoded in one pass (tolerance as above)."""
    root, written = fixture
    ds = LeRobotStream(root, image_key=None)
    for m, ep in zip(ds.episodes, written["episodes"], strict=True):
        arrays = ds.episode_arrays(m, ["observation.state", "action", FRONT, WRIST])
        np.testing.assert_array_equal(arrays["observation.state"], np.asarray(ep["observation.state"], np.float32))
        np.testing.assert_array_equal(arrays["action"], np.asarray(ep["action"], np.float32))
        assert arrays[FRONT].shape == (ep["length"], written["height"], written["width"], 3)
        for t in range(ep["length"]):
            _check_video_frame(arrays[FRONT][t], m.index, t, written)
            np.testing.assert_array_equal(arrays[WRIST][t], frame_image(m.index, t, 1))


def test_inspect_agrees_with_written_values_and_lerobot_stats(fixture):
    """Oracle: numpy statistics of written.json's states and actions. lerobot's own stats.json (v3.0) agrees with
    lf-data's recomputation in mean/std/min/max; its q01/q99 are length-weighted means of per-episode quantiles
    (lerobot 0.4 ``aggregate_stats``), and inspect reports exactly the dimensions where the share of written
    values beyond them exceeds 2 x 1% plus one value (28 frames here)."""
    root, written = fixture
    report = inspect_dataset(root)
    total = sum(ep["length"] for ep in written["episodes"])
    assert report["format"] == f"lerobot-{written['codebase_version']}"
    assert (report["episodes"], report["frames"], report["frames_read"], report["tasks"], report["fps"]) == (
        len(written["episodes"]), total, total, len(_task_list(written)), written["fps"])
    assert report["skipped"] == {}
    stored = json.loads((root / "meta/stats.json").read_text()) if (root / "meta/stats.json").is_file() else {}
    flagged = []
    for key in ("observation.state", "action"):
        values = np.concatenate([np.asarray(ep[key], np.float64) for ep in written["episodes"]])
        for name, below in (("q01", True), ("q99", False)):
            if key in stored:
                bound = np.asarray(stored[key][name], np.float64)
                share = (values < bound).mean(0) if below else (values > bound).mean(0)
                bad = np.flatnonzero(share > 0.02 + 1 / len(values)).tolist()
                if bad:
                    flagged.append((key, name, bad))
    assert bool(flagged) == (written["codebase_version"] == "v3.0")
    assert len(report["problems"]) == len(flagged)
    for (key, name, bad), problem in zip(flagged, report["problems"], strict=True):
        assert f"stats[{key!r}][{name!r}] disagrees with the {total} frames read in {len(bad)} of" in problem
        assert [int(d) for d in re.findall(r"dimension (\d+):", problem)] == bad
    for key in ("observation.state", "action"):
        values = np.concatenate([np.asarray(ep[key], np.float64) for ep in written["episodes"]])
        st = report["stats"][key]
        np.testing.assert_allclose(np.asarray(st["mean"], np.float64), values.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(st["std"], np.float64), values.std(0), rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(st["min"], np.float64), values.min(0))
        np.testing.assert_array_equal(np.asarray(st["max"], np.float64), values.max(0))


def test_in_memory_reader_v30():
    """Oracle: written.json for the v3.0 fixture read by the in-memory LeRobotDataset (PNG camera, exact)."""
    root, written = DATA / "lerobot_v30" / "dataset", json.loads((DATA / "lerobot_v30/written.json").read_text())
    tasks = _task_list(written)
    for preload in (1 << 30, 0):
        ds = LeRobotDataset(root, action_horizon=2, image_key=WRIST, preload_max_bytes=preload)
        assert ds.tasks == tasks and ds.fps == written["fps"] and ds.num_episodes == len(written["episodes"])
        i = 0
        for ep in written["episodes"]:
            e, n = ep["episode_index"], ep["length"]
            action = np.asarray(ep["action"], np.float32)
            for t in range(n):
                item = ds[i]
                i += 1
                assert (item["episode_index"], item["frame_index"], item["task"]) == (e, t, ep["task"])
                assert item["task_index"] == tasks.index(ep["task"])
                np.testing.assert_array_equal(item["state"].numpy(), np.asarray(ep["observation.state"][t], np.float32))
                np.testing.assert_array_equal(item["actions"].numpy(), action[np.minimum([t, t + 1], n - 1)])
                np.testing.assert_array_equal(item["image"].numpy(), frame_image(e, t, 1))
        assert i == len(ds)


def test_in_memory_reader_refuses_v21_naming_the_field():
    """Oracle: the documented limit (the in-memory reader is v3.0 only); the message names file, field, value."""
    with pytest.raises(ValueError, match=r"meta/info\.json.*'codebase_version' is 'v2\.1'"):
        LeRobotDataset(DATA / "lerobot_v21" / "dataset", image_key=WRIST)


def test_task_column_named_unnamed_and_absent(tmp_path):
    """Regression: lerobot 0.4's recording path writes tasks.parquet with an unnamed pandas index
    (``__index_level_0__``), which lf-data read as a missing ``task`` column. Oracle: the column holding the
    task strings in each layout; a table with neither is a DataError naming the file."""
    unnamed = pa.table({"task_index": [0], "__index_level_0__": ["a"]}).replace_schema_metadata(
        {b"pandas": json.dumps({"index_columns": ["__index_level_0__"]}).encode()})
    assert task_column(unnamed) == "__index_level_0__"
    assert task_column(pa.table({"task_index": [0], "task": ["a"]})) == "task"
    assert task_column(pa.table({"task_index": [0], "what": ["a"]})) is None
    root = tmp_path / "ds"
    shutil.copytree(DATA / "lerobot_v30" / "dataset", root)
    pq.write_table(pa.table({"task_index": [0, 1], "what": ["a", "b"]}), root / "meta/tasks.parquet")
    with pytest.raises(DataError, match=r"meta/tasks\.parquet.*task_index and task"):
        load_lerobot_meta(root)
