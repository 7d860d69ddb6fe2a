"""inspect_dataset and convert_dataset: LeRobot v2.1 (video) -> v3.0, RLDS -> LeRobot v3.0, statistics check."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("av")

from test_lerobot_video import CAM, FEATURES, LENGTHS, _episodes  # noqa: E402

from lf_data import LeRobotDataset, compute_stats, write_lerobot_v3  # noqa: E402
from lf_data._inspect import convert_dataset, inspect_dataset  # noqa: E402
from lf_data._lerobot_video_writer import write_lerobot_video  # noqa: E402


@pytest.fixture
def v21(tmp_path):
    eps = _episodes()
    return write_lerobot_video(tmp_path / "v21", eps, version="v2.1", fps=10, features=FEATURES), eps


def test_convert_v21_video_to_v3_reads_back(v21, tmp_path):
    """Oracle: the arrays written to the v2.1 dataset (lossless mp4 -> PNG), read by LeRobotDataset."""
    root, eps = v21
    out = convert_dataset(root, tmp_path / "v3")
    assert out == {"format": "lerobot-v2.1", "episodes": 3, "skipped": {}, "problems": []}
    ds = LeRobotDataset(tmp_path / "v3", image_key=CAM)
    assert len(ds) == sum(LENGTHS) and ds.fps == 10
    i = 0
    for ep in eps:
        for t in range(len(ep["frames"]["action"])):
            item = ds[i]
            np.testing.assert_array_equal(item["image"].numpy(), ep["frames"][CAM][t])
            np.testing.assert_array_equal(item["actions"][0].numpy(), ep["frames"]["action"][t])
            assert item["task"] == ep["task"]
            i += 1
    assert inspect_dataset(tmp_path / "v3")["problems"] == []


def test_convert_skips_bad_episode(v21, tmp_path):
    """Oracle: episode 1's video is deleted; skip writes the other two and reports the file."""
    root, _ = v21
    (root / f"videos/chunk-000/{CAM}/episode_000001.mp4").unlink()
    with pytest.raises(ValueError, match="episode_000001.mp4: video of feature"):
        convert_dataset(root, tmp_path / "a")
    out = convert_dataset(root, tmp_path / "b", on_error="skip")
    assert out["episodes"] == 2 and out["skipped"] == {"missing_file": 1}


def test_inspect_recomputes_stats_and_reports_problems(v21, tmp_path):
    """Oracle: compute_stats of the written actions; a tampered stats.json and a NaN are reported by name."""
    root, eps = v21
    rep = inspect_dataset(root)
    assert (rep["format"], rep["episodes"], rep["frames"], rep["fps"]) == ("lerobot-v2.1", 3, sum(LENGTHS), 10)
    assert rep["features"][CAM] == {"dtype": "video", "shape": [16, 16, 3]} and rep["problems"] == []
    want = compute_stats(np.concatenate([e["frames"]["action"] for e in eps]))
    np.testing.assert_allclose(rep["stats"]["action"]["mean"], want["mean"], rtol=1e-12)
    convert_dataset(root, tmp_path / "v3")
    stats_path = tmp_path / "v3/meta/stats.json"
    stats = json.loads(stats_path.read_text())
    stats["action"]["mean"][0] += 0.5
    stats_path.write_text(json.dumps(stats))
    rep = inspect_dataset(tmp_path / "v3")
    assert len(rep["problems"]) == 1 and "stats['action']['mean']" in rep["problems"][0]
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    (bad / "meta/episodes.jsonl").write_text((bad / "meta/episodes.jsonl").read_text().replace(
        '"tasks": ["pick the cube"]', '"tasks": []', 1))
    rep = inspect_dataset(bad)
    assert rep["skipped"] == {"missing_instruction": 1}
    assert "episode 0 has no language instruction" in rep["problems"][0]


def test_convert_rlds_to_v3(tmp_path):
    """Oracle: RLDSDataset's own samples of the source (images, first action, state, task)."""
    pytest.importorskip("tfrecord")
    from test_rlds import _bridge

    from lf_data import RLDSDataset

    root, _, _ = _bridge(tmp_path)
    out = convert_dataset(root, tmp_path / "v3", fps=5)
    assert out["format"] == "rlds" and out["episodes"] == 3
    src, dst = RLDSDataset(root), LeRobotDataset(tmp_path / "v3")
    assert len(src) == len(dst) and dst.fps == 5
    for i in range(len(src)):
        a, b = src[i], dst[i]
        for key in ("image", "state"):
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
        np.testing.assert_array_equal(a["actions"][0].numpy(), b["actions"][0].numpy())
        assert (a["task"], a["frame_index"]) == (b["task"], b["frame_index"])
    assert inspect_dataset(root)["format"] == "rlds"


def test_inspect_notes_failed_generator_episodes(v21, tmp_path):
    """Oracle: the failed-episode counts a generator recorded in info.json["lf"] appear as notes, zeros omitted."""
    root, _ = v21
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["lf"] = {"episodes_attempted": {"push-v3": 40, "reach-v3": 40}, "episodes_failed": {"push-v3": 1,
                                                                                             "reach-v3": 0}}
    info_path.write_text(json.dumps(info))
    notes = inspect_dataset(root)["notes"]
    assert [n for n in notes if "expert episodes" in n] == [
        f"{info_path}: 1 of 40 expert episodes of 'push-v3' failed within max_steps and were not written"]


def _offset_episodes(lengths=(40, 60, 50, 70), seed=3):
    """Episodes whose actions sit around different means: per-episode quantiles then miss the dataset's."""
    rng = np.random.default_rng(seed)
    return [{"task": "reach", "frames": {
        "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
        "action": (rng.normal(size=(n, 3)) * 0.1 + [e - 1.5, 0.0, 2.0 * e]).astype(np.float32)}}
        for e, n in enumerate(lengths)]


def test_inspect_checks_stored_quantiles(tmp_path):
    """Oracle: numpy's quantiles of the written actions. The writer's exact q01/q99 give no problem; q01/q99
    replaced by the length-weighted mean of per-episode quantiles (as lerobot 0.4's aggregate_stats and some
    converters write them) leave far more than 1% of the values outside in dimensions 0 and 2 (the offset ones),
    and inspect names exactly those dimensions with the shares beyond."""
    eps = _offset_episodes()
    root = write_lerobot_v3(tmp_path / "ds", eps, fps=10, features={
        "observation.state": {"dtype": "float32", "shape": [2]}, "action": {"dtype": "float32", "shape": [3]}})
    assert inspect_dataset(root)["problems"] == []
    actions = [e["frames"]["action"].astype(np.float64) for e in eps]
    n = np.array([len(a) for a in actions], np.float64)
    stats_path = root / "meta/stats.json"
    stats = json.loads(stats_path.read_text())
    all_actions = np.concatenate(actions)
    for name, q in (("q01", 0.01), ("q99", 0.99)):
        stats["action"][name] = (np.stack([np.quantile(a, q, axis=0) for a in actions]) * n[:, None]).sum(0) / n.sum()
        stats["action"][name] = stats["action"][name].tolist()
    stats_path.write_text(json.dumps(stats))
    problems = inspect_dataset(root)["problems"]
    assert len(problems) == 2
    for problem, name, beyond in zip(problems, ("q01", "q99"), (
            (all_actions < stats["action"]["q01"]).mean(0), (all_actions > stats["action"]["q99"]).mean(0)),
            strict=True):
        assert problem.startswith(f"{stats_path}: stats['action'][{name!r}] disagrees with the 220 frames read in "
                                  "2 of 3 dimensions")
        assert "dimension 1" not in problem and beyond[0] > 0.15 and beyond[2] > 0.15
        for d in (0, 2):
            assert f"dimension {d}: {stats['action'][name][d]:.4g} has {beyond[d]:.1%} of the values" in problem


@pytest.mark.parametrize("n", [1, 2, 7, 28, 99, 100, 101, 1000])
def test_exact_quantiles_pass_for_any_frame_count(n):
    """Oracle: numpy's own (linear) quantiles of continuous, discrete and constant columns are never reported,
    whatever the frame count (interpolated quantiles of few frames leave one value outside by construction)."""
    from lf_data._inspect_checks import quantile_problems

    rng = np.random.default_rng(n)
    x = np.stack([rng.normal(size=n), rng.integers(-1, 2, n), np.full(n, 0.5)], axis=1)
    stored = {"q01": np.quantile(x, 0.01, axis=0).tolist(), "q99": np.quantile(x, 0.99, axis=0).tolist()}
    assert quantile_problems(stored, x, "action", "stats.json") == []
    stored["q01"][0] = float(x[:, 0].min()) - 1.0  # below every value: seen once one value is under 0.5%
    assert (quantile_problems(stored, x, "action", "stats.json") != []) == (n > 200)


def test_messages_name_the_file_or_argument_not_the_function(v21, tmp_path):
    """Oracle: the contract for user-facing errors: they start with the file or the argument at fault, never
    with an lf-data function's name (they said ``write_lerobot_v3: ...``, ``convert_dataset: ...``)."""
    import lf_data

    root, _ = v21
    convert_dataset(root, tmp_path / "v3")
    feats = {"action": {"dtype": "float32", "shape": [1]}}
    cases = [
        (lambda: write_lerobot_v3(tmp_path / "v3", [], fps=10, features=feats), f"{tmp_path / 'v3'}: out_dir exists"),
        (lambda: write_lerobot_v3(tmp_path / "empty", [], fps=10, features=feats),
         f"{tmp_path / 'empty'}: no episodes were given"),
        (lambda: convert_dataset(tmp_path / "v3", tmp_path / "x"), f"{tmp_path / 'v3'}: already LeRobot v3.0"),
        (lambda: convert_dataset(root, tmp_path / "x", to="rlds"), "to must be 'lerobot-v3', got 'rlds'"),
        (lambda: compute_stats(np.zeros((0, 2))), "array has no rows"),
        (lambda: LeRobotDataset(tmp_path / "v3", image_key=CAM, action_horizon=0), "action_horizon must be >= 1"),
        (lambda: lf_data.LeRobotStream(root, rank=2, world_size=2), "rank must be in [0, world_size)"),
    ]
    for call, start in cases:
        with pytest.raises((ValueError, FileExistsError)) as err:
            call()
        assert str(err.value).startswith(start), str(err.value)
        assert str(err.value).split(":")[0] not in dir(lf_data)
