"""`lf data inspect|convert|metaworld` through Typer's CliRunner on LeRobot v2.1 datasets with mp4 videos."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("av")

from lf_data import write_lerobot_video  # noqa: E402
from lf_orchestrator.cli import app  # noqa: E402

runner = CliRunner()
CAM = "observation.images.top"
FEATURES = {CAM: {"dtype": "video", "shape": [8, 8, 3]}, "observation.state": {"dtype": "float32", "shape": [2]},
            "action": {"dtype": "float32", "shape": [2]}}


@pytest.fixture
def v21(tmp_path):
    rng = np.random.default_rng(0)
    eps = [{"task": "stack the cups", "frames": {CAM: rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                                                 "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
                                                 "action": rng.normal(size=(n, 2)).astype(np.float32)}}
           for n in (4, 6)]
    return write_lerobot_v21(tmp_path, eps)


def write_lerobot_v21(tmp_path, eps):
    return write_lerobot_video(tmp_path / "v21", eps, version="v2.1", fps=15, features=FEATURES)


def test_inspect_reports_format_and_exit_codes(v21):
    """Oracle: the written dataset (2 episodes, 10 frames); a missing video gives exit 1 naming the file."""
    res = runner.invoke(app, ["data", "inspect", str(v21), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert (rep["format"], rep["episodes"], rep["frames"], rep["problems"]) == ("lerobot-v2.1", 2, 10, [])
    res = runner.invoke(app, ["data", "inspect", str(v21)])
    assert res.exit_code == 0 and "lerobot-v2.1, 2 episodes, 10 frames at 15 fps" in res.stdout
    (v21 / f"videos/chunk-000/{CAM}/episode_000001.mp4").unlink()
    res = runner.invoke(app, ["data", "inspect", str(v21)])
    assert res.exit_code == 1 and "episode_000001.mp4" in res.stdout and "missing" in res.stdout


def test_convert_then_inspect(v21, tmp_path):
    """Oracle: the converted folder inspects as LeRobot v3.0 with the same frame count and no problems."""
    res = runner.invoke(app, ["data", "convert", str(v21), str(tmp_path / "v3"), "--to", "lerobot-v3"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["data", "inspect", str(tmp_path / "v3"), "--json"])
    rep = json.loads(res.stdout)
    assert (rep["format"], rep["episodes"], rep["frames"], rep["problems"]) == ("lerobot-v3.0", 2, 10, [])
    res = runner.invoke(app, ["data", "convert", str(v21), str(tmp_path / "x"), "--to", "rlds"])
    assert res.exit_code == 2 and "to must be 'lerobot-v3', got 'rlds'" in res.output


def test_unknown_layout_and_metaworld_still_registered(tmp_path):
    """Oracle: the error names the folder; `lf data metaworld --help` still works after the move."""
    res = runner.invoke(app, ["data", "inspect", str(tmp_path)])
    assert res.exit_code == 2 and "unknown dataset layout" in res.output
    assert runner.invoke(app, ["data", "metaworld", "--help"]).exit_code == 0


def test_inspect_reports_missing_stats_as_lf_run_does(v21, tmp_path):
    """Oracle: the error LeRobotDataset raises (what `lf run` stops with) on the converted LeRobot v3.0 folder
    with meta/stats.json deleted: inspect reports that same message as its one problem and exits 1 (it said "no
    problems found" and exited 0)."""
    from lf_data import LeRobotDataset

    out = runner.invoke(app, ["data", "convert", str(v21), str(tmp_path / "v3")])
    assert out.exit_code == 0, out.output
    rep = json.loads(runner.invoke(app, ["data", "inspect", str(tmp_path / "v3"), "--json"]).stdout)
    assert rep["problems"] == [] and rep["notes"] == []
    (tmp_path / "v3" / "meta" / "stats.json").unlink()
    with pytest.raises(FileNotFoundError) as err:
        LeRobotDataset(tmp_path / "v3", image_key=CAM)
    res = runner.invoke(app, ["data", "inspect", str(tmp_path / "v3"), "--json"])
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["problems"] == [str(err.value)]
    res = runner.invoke(app, ["data", "inspect", str(tmp_path / "v3")])
    text = " ".join(res.stdout.split())
    assert res.exit_code == 1 and "1 problem:" in text and "skipped" not in text and "1 problems" not in text
    assert "LeRobot dataset file missing:" in text and "stats.json" in text


def test_inspect_names_a_shared_broken_file_once(tmp_path):
    """Oracle: a LeRobot v3.0 dataset written by lf with its one mp4 (shared by all three episodes) deleted:
    one problem naming the file and episodes 0-2 (it was repeated once per episode), three episodes skipped."""
    rng = np.random.default_rng(1)
    eps = [{"task": "stack the cups", "frames": {CAM: rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                                                 "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
                                                 "action": rng.normal(size=(n, 2)).astype(np.float32)}}
           for n in (3, 4, 5)]
    root = write_lerobot_video(tmp_path / "v30", eps, version="v3.0", fps=15, features=FEATURES)
    video = root / f"videos/{CAM}/chunk-000/file-000.mp4"
    video.unlink()
    res = runner.invoke(app, ["data", "inspect", str(root), "--json"])
    rep = json.loads(res.stdout)
    assert res.exit_code == 1 and rep["skipped"] == {"missing_file": 3}
    assert rep["problems"] == [f"{video}: video of feature {CAM!r} missing (episodes 0-2)"]
    text = " ".join(runner.invoke(app, ["data", "inspect", str(root)]).stdout.split())
    assert "1 problem (skipped: {'missing_file': 3}):" in text


def test_inspect_lists_episodes_off_the_frame_grid(tmp_path):
    """Oracle: the corrupted cell: episode 1's videos/<camera>/from_timestamp moved by 0.6 frame (which shifted
    every frame of it by one, silently) is listed as a problem with its drift; --tolerance-s widens the grid."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(2)
    eps = [{"task": "stack the cups", "frames": {CAM: rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                                                 "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
                                                 "action": rng.normal(size=(n, 2)).astype(np.float32)}}
           for n in (3, 4, 5)]
    root = write_lerobot_video(tmp_path / "v30", eps, version="v3.0", fps=15, features=FEATURES)
    meta = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(meta)
    column = f"videos/{CAM}/from_timestamp"
    values = table[column].to_pylist()
    values[1] = (3 + 0.6) / 15
    pq.write_table(table.set_column(table.column_names.index(column), column, pa.array(values)), meta)
    res = runner.invoke(app, ["data", "inspect", str(root), "--json"])
    rep = json.loads(res.stdout)
    assert res.exit_code == 1 and rep["skipped"] == {"timestamp": 1}
    assert rep["problems"][0].startswith(f"{meta}: episode 1, frame 0: {column} = 0.240000 s is -0.026667 s off "
                                         "the frame grid of 15 fps")
    assert all("episode 1" not in p for p in rep["problems"][1:])  # the rest: stats of the episodes read
    res = runner.invoke(app, ["data", "inspect", str(root), "--tolerance-s", "0.05", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["problems"] == []


def test_inspect_table_omits_empty_skipped(tmp_path):
    """Oracle: a LeRobot v3.0 dataset written by write_lerobot_v3 with q01 > q99 tampered into meta/stats.json and
    no episode skipped: the problem line says "q01 > q99" and the header no longer prints "(skipped: {})"."""
    from lf_data import write_lerobot_v3

    rng = np.random.default_rng(1)
    eps = [{"task": "t", "frames": {k: rng.normal(size=(n, 2)).astype(np.float32) for k in ("observation.state",
                                                                                          "action")}}
           for n in (20, 30)]
    root = write_lerobot_v3(tmp_path / "v3", eps, fps=10, features={
        k: {"dtype": "float32", "shape": [2]} for k in ("observation.state", "action")})
    path = root / "meta/stats.json"
    stats = json.loads(path.read_text())
    stats["action"]["q01"][1] = stats["action"]["q99"][1] + 1.0
    path.write_text(json.dumps(stats))
    res = runner.invoke(app, ["data", "inspect", str(root)])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and "skipped" not in text and "q01 > q99 in 1 of 2 dimensions: dimension 1" in text
