"""`lf data convert` that fails midway: exit 2, nothing left at the destination, and the retry succeeds.

Oracle: the destination's parent listed after the failure, and `lf data inspect` of the retried conversion.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("av")

from lf_data import write_lerobot_video  # noqa: E402
from lf_orchestrator.cli import app  # noqa: E402

CAM = "observation.images.top"
FEATURES = {CAM: {"dtype": "video", "shape": [8, 8, 3]}, "observation.state": {"dtype": "float32", "shape": [2]},
            "action": {"dtype": "float32", "shape": [2]}}
runner = CliRunner()


def v21_with_corrupt_last_episode(folder):
    """LeRobot v2.1, 3 episodes (4, 6, 5 frames); episode 2's parquet pages overwritten (footer intact)."""
    rng = np.random.default_rng(0)
    eps = [{"task": "stack the cups", "frames": {CAM: rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                                                 "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
                                                 "action": rng.normal(size=(n, 2)).astype(np.float32)}}
           for n in (4, 6, 5)]
    root = write_lerobot_video(folder / "v21", eps, version="v2.1", fps=15, features=FEATURES)
    path = root / "data/chunk-000/episode_000002.parquet"
    good = path.read_bytes()
    path.write_bytes(good[:4] + b"\xff" * 296 + good[300:])
    return root, path, good


def test_convert_failure_then_retry(tmp_path):
    """A corrupt episode-2 parquet: exit 2 naming it, no out/ folder left (was: data/ without meta/); retry works."""
    root, path, good = v21_with_corrupt_last_episode(tmp_path)
    out = tmp_path / "out"
    res = runner.invoke(app, ["data", "convert", str(root), str(out)])
    assert res.exit_code == 2 and "episode_000002.parquet" in res.output.replace("\n", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v21"]
    path.write_bytes(good)
    res = runner.invoke(app, ["data", "convert", str(root), str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads(runner.invoke(app, ["data", "inspect", str(out), "--json"]).stdout)
    assert (rep["format"], rep["episodes"], rep["frames"], rep["problems"]) == ("lerobot-v3.0", 3, 15, [])


def test_lf_run_on_v21_points_to_lf_data_convert(tmp_path, tiny_config):
    """`lf run` on a LeRobot v2.1 dataset names the exact `lf data convert <in> <out>` command (was: LeRobot's
    script). Oracle: that command, run as printed, converts the dataset."""
    import shlex

    rng = np.random.default_rng(0)
    feats = {"observation.image": {"dtype": "video", "shape": [32, 32, 3]},
             "observation.state": {"dtype": "float32", "shape": [39]}, "action": {"dtype": "float32", "shape": [4]}}
    eps = [{"task": "reach the goal", "frames": {
        "observation.image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(n, 39)).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, 4)).astype(np.float32)}} for n in (6, 7)]
    root = write_lerobot_video(tmp_path / "my data", eps, version="v2.1", fps=10, features=feats)
    res = runner.invoke(app, ["run", str(tiny_config), "--set", "data.source='lerobot'", "--set",
                              f"data.path='{root}'", "--set", "data.tasks=['*']"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "'codebase_version' is 'v2.1'" in text and "LeRobot's" not in text
    command = text.split("convert it with `")[1].split("`")[0]
    assert command == f"lf data convert {shlex.quote(str(root))} {shlex.quote(str(root) + '-v3.0')}"
    res = runner.invoke(app, shlex.split(command)[1:])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "my data-v3.0" / "meta/info.json").is_file()
