"""LeRobot v2.1 / v3.0 with mp4 video features: detection, frame-exact decoding, windows, bad input.

Datasets are written in LeRobot's layouts by ``write_lerobot_video`` (the ``lerobot``
package pins torch<2.11 and cannot be installed here). Videos are lossless
(H.264 RGB, crf 0), so decoded frames must equal the written arrays exactly.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("av")

from lf_data._errors import DataError  # noqa: E402
from lf_data._lerobot_meta import detect_format  # noqa: E402
from lf_data._lerobot_stream import LeRobotStream  # noqa: E402
from lf_data._lerobot_video_writer import write_lerobot_video  # noqa: E402
from lf_data._video import count_frames, read_video_frames, write_video  # noqa: E402

CAM = "observation.images.top"
FEATURES = {
    CAM: {"dtype": "video", "shape": [16, 16, 3]},
    "observation.state": {"dtype": "float32", "shape": [3]},
    "action": {"dtype": "float32", "shape": [2]},
}
LENGTHS = [5, 9, 4]


def _episodes(lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [{"task": ["pick the cube", "open the drawer"][e % 2], "frames": {
        CAM: rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
        "action": rng.normal(size=(n, 2)).astype(np.float32)}} for e, n in enumerate(lengths)]


@pytest.fixture(params=["v2.1", "v3.0"])
def video_ds(request, tmp_path):
    eps = _episodes()
    root = write_lerobot_video(tmp_path / "ds", eps, version=request.param, fps=10, features=FEATURES)
    return request.param, root, eps


def test_video_frames_by_index_exact(tmp_path):
    """Oracle: the frames given to the lossless encoder, for any index order and a seek past the start."""
    frames = np.random.default_rng(1).integers(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    path = write_video(tmp_path / "v.mp4", frames, fps=30)
    assert count_frames(path).frames == 40 and count_frames(path).fps == 30
    idx = [37, 3, 3, 20, 0, 39]
    np.testing.assert_array_equal(read_video_frames(path, idx), frames[idx])


def test_detect_and_read_all_frames(video_ds):
    """Oracle: the arrays given to the writer (lossless video, exact float32 parquet)."""
    version, root, eps = video_ds
    assert detect_format(root) == f"lerobot-{version}"
    ds = LeRobotStream(root, action_horizon=3)
    assert ds.meta.video_keys == [CAM] and ds.image_key == CAM and ds.num_frames == sum(LENGTHS)
    samples = list(ds)
    assert len(samples) == sum(LENGTHS)
    i = 0
    for e, ep in enumerate(eps):
        f, n = ep["frames"], len(ep["frames"]["action"])
        for t in range(n):
            s = samples[i]
            np.testing.assert_array_equal(s["image"].numpy(), f[CAM][t])
            np.testing.assert_array_equal(s["state"].numpy(), f["observation.state"][t])
            want = np.minimum(t + np.arange(3), n - 1)
            np.testing.assert_array_equal(s["actions"].numpy(), f["action"][want])
            assert s["action_is_pad"].tolist() == [t + j >= n for j in range(3)]
            assert (s["task"], s["episode_index"], s["frame_index"]) == (ep["task"], e, t)
            i += 1


def test_delta_timestamps_windows(video_ds):
    """Oracle: LeRobot's rule (clamp to the episode, pad mask outside) on the written arrays."""
    _, root, eps = video_ds
    ds = LeRobotStream(root, episodes=[1], delta_timestamps={"observation.state": [-0.2, -0.1, 0.0],
                                                            CAM: [-0.1, 0.0]})
    samples = list(ds)
    f = eps[1]["frames"]
    for t, s in enumerate(samples):
        np.testing.assert_array_equal(s["observation.state"].numpy(), f["observation.state"][np.clip(
            [t - 2, t - 1, t], 0, None)])
        assert s["observation.state_is_pad"].tolist() == [t < 2, t < 1, False]
        np.testing.assert_array_equal(s[CAM].numpy(), f[CAM][np.clip([t - 1, t], 0, None)])
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]: 0.05 s is not a multiple"):
        LeRobotStream(root, delta_timestamps={"action": [0.05]})


def test_rank_sharding(video_ds):
    """Oracle: the single-reader stream; ranks read disjoint episodes whose union is all."""
    _, root, _ = video_ds
    whole = {(s["episode_index"], s["frame_index"]) for s in LeRobotStream(root)}
    parts = [{(s["episode_index"], s["frame_index"]) for s in LeRobotStream(root, rank=r, world_size=2)}
             for r in range(2)]
    assert not parts[0] & parts[1] and parts[0] | parts[1] == whole


def _break(root, version, what):
    """Damage episode 1 of the dataset and return (expected reason, message regex)."""
    if version == "v2.1":
        video = root / f"videos/chunk-000/{CAM}/episode_000001.mp4"
        data = root / "data/chunk-000/episode_000001.parquet"
    else:
        video = root / f"videos/{CAM}/chunk-000/file-000.mp4"
        data = root / "data/chunk-000/file-000.parquet"
    if what == "missing_video":
        video.unlink()
        return "missing_file", r"video of feature 'observation.images.top' missing \(episode [01]\)"
    if what == "lfs":
        video.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n")
        return "lfs_pointer", r"Git LFS pointer file in place of the video .* \(episode [01];"
    if what == "frame_count":
        frames = np.zeros((7 if version == "v2.1" else 10, 16, 16, 3), np.uint8)
        video.unlink()
        write_video(video, frames, 10)
        return "frame_count", r"video holds (7|10) frames, episode 1 needs frames"
    if what == "task":
        if version == "v2.1":
            path = root / "meta/episodes.jsonl"
            rows = [json.loads(x) for x in path.read_text().splitlines()]
            rows[1]["tasks"] = []
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            import pyarrow.parquet as pq

            path = next((root / "meta/episodes").glob("*/*.parquet"))
            t = pq.read_table(path).to_pylist()
            t[1]["tasks"] = []
            import pyarrow as pa

            pq.write_table(pa.Table.from_pylist(t), path)
        return "missing_instruction", r"episode 1 has no language instruction"
    if what == "nan":
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = pq.read_table(data)
        act = t.column("action").combine_chunks().flatten().to_numpy().copy().reshape(-1, 2)
        row = 1 if version == "v2.1" else LENGTHS[0] + 1
        act[row, 0] = np.nan
        col = pa.FixedSizeListArray.from_arrays(pa.array(act.reshape(-1)), 2)
        pq.write_table(t.set_column(t.column_names.index("action"), "action", col), data)
        return "non_finite", r"NaN/inf in feature 'action' of episode 1 at frame 1"
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["missing_video", "lfs", "frame_count", "task", "nan"])
def test_bad_input_raise_and_skip(video_ds, tmp_path, what):
    """Oracle: the damaged episode is named in the error; with skip, exactly the other episodes are read."""
    version, root, _ = video_ds
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    reason, message = _break(broken, version, what)
    with pytest.raises(DataError, match=message) as info:
        list(LeRobotStream(broken))
    assert info.value.reason == reason
    ds = LeRobotStream(broken, on_error="skip")
    eps = sorted({s["episode_index"] for s in ds})
    if version == "v3.0" and what in ("missing_video", "lfs"):  # one mp4 holds every episode
        assert eps == [] and ds.skipped == {reason: 3}
    elif version == "v3.0" and what == "frame_count":  # the shared mp4 is cut inside episode 1
        assert eps == [0] and ds.skipped == {reason: 2}
    else:
        assert eps == [0, 2] and ds.skipped == {reason: 1}
        assert len(ds.problems) == 1


def test_streaming_memory_is_bounded(tmp_path):
    """Oracle: tracemalloc's peak while streaming 8 episodes x 64 frames of 32x32 video (1.5 MB decoded)
    stays below a third of the decoded dataset: at most two 32-frame blocks per camera are held."""
    import tracemalloc

    rng = np.random.default_rng(3)
    feats = {**FEATURES, CAM: {"dtype": "video", "shape": [32, 32, 3]}}
    eps = [{"task": "t", "frames": {CAM: rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8),
                                    "observation.state": np.zeros((64, 3), np.float32),
                                    "action": np.zeros((64, 2), np.float32)}} for _ in range(8)]
    root = write_lerobot_video(tmp_path / "big", eps, version="v3.0", fps=10, features=feats)
    ds = LeRobotStream(root)
    total = 8 * 64 * 32 * 32 * 3
    tracemalloc.start()
    n = 0
    for s in ds:
        n += 1
        del s
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == 8 * 64
    assert peak < total / 3, (peak, total)
