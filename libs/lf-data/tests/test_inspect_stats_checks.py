"""``lf data inspect``'s stored-statistics checks: skipped episodes, per-dimension mismatches, unusable bounds.

Datasets are written by lf's own ``write_lerobot_v3`` (exact statistics of the written frames), then
``meta/stats.json`` or one frame's timestamp is tampered with in place.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lf_data import DataError, write_lerobot_v3
from lf_data._inspect import inspect_dataset

FEATURES = {"observation.state": {"dtype": "float32", "shape": [6]}, "action": {"dtype": "float32", "shape": [3]}}
DATA_FILE = "data/chunk-000/file-000.parquet"


def _write(tmp_path, lengths=(30, 40, 50)):
    rng = np.random.default_rng(0)
    eps = [{"task": "reach", "frames": {
        "observation.state": rng.normal(size=(n, 6)).astype(np.float32),
        "action": (rng.normal(size=(n, 3)) + 3.0 * e).astype(np.float32)}} for e, n in enumerate(lengths)]
    return write_lerobot_v3(tmp_path / "ds", eps, fps=10, features=FEATURES)


def _edit_stats(root, edit) -> str:
    path = root / "meta/stats.json"
    stats = json.loads(path.read_text())
    edit(stats)
    path.write_text(json.dumps(stats))
    return str(path)


def test_skipped_episode_does_not_fake_stats_problems(tmp_path):
    """Oracle: the writer's stats.json is exact for all frames. With episode 1 skipped (a timestamp off the frame
    grid) the frames read are a part of the dataset, so comparing gave ~10 false problems; now the one problem is
    the timestamp, and a note says the statistics were not compared."""
    root = _write(tmp_path)
    table = pq.read_table(root / DATA_FILE)
    ts = table["timestamp"].to_pylist()
    ts[33] += 0.05  # episode 1, frame 3
    i = table.column_names.index("timestamp")
    pq.write_table(table.set_column(i, table.field(i), pa.array(ts, table.field(i).type)), root / DATA_FILE)
    rep = inspect_dataset(root)
    assert rep["skipped"] == {"timestamp": 1}
    assert len(rep["problems"]) == 1 and "timestamp" in rep["problems"][0], rep["problems"]
    assert "stats not compared: 1 episode(s) skipped" in " ".join(rep["notes"])
    _edit_stats(root, lambda s: s["action"]["q01"].__setitem__(2, float("nan")))  # wrong whatever was read
    assert "stats['action']['q01'] is not finite" in inspect_dataset(root)["problems"][1]


def test_mismatch_names_the_differing_dimension(tmp_path):
    """Oracle: the writer's exact stats with dimension 5 of observation.state's min changed: the message names
    dimension 5 with the stored and the frames' value, and no other dimension."""
    root = _write(tmp_path)
    saved = {}

    def edit(stats):
        saved["min"] = stats["observation.state"]["min"][5]
        stats["observation.state"]["min"][5] -= 1.0

    path = _edit_stats(root, edit)
    problems = inspect_dataset(root)["problems"]
    assert len(problems) == 1, problems
    p = problems[0]
    assert p.startswith(f"{path}: stats['observation.state']['min'] differs from the raw frames in 1 of 6 dimensions")
    assert f"dimension 5: stored {saved['min'] - 1.0:.6g}, frames {saved['min']:.6g}" in p
    assert "dimension 0" not in p


def test_inspect_says_q01_above_q99_and_not_finite(tmp_path):
    """Oracle: the tampered cells: q01[0] > q99[0] is named "q01 > q99" with both values; a NaN in q99[2] is named
    "not finite"."""
    root = _write(tmp_path)
    path = _edit_stats(root, lambda s: s["action"].update(q01=[0.66] + s["action"]["q01"][1:],
                                                          q99=[-1.0, s["action"]["q99"][1], float("nan")]))
    text = "\n".join(inspect_dataset(root)["problems"])
    assert f"{path}: stats['action'] has q01 > q99 in 1 of 3 dimensions: dimension 0: q01 = 0.66 > q99 = -1" in text
    assert f"{path}: stats['action']['q99'] is not finite in 1 of 3 dimensions: dimension 2: nan" in text


def test_check_action_stats_names_file_feature_key_dimension():
    """Oracle: hand-written stats entries. Unusable bounds raise DataError naming the file, 'action', the key and
    the dimension; zero-width bounds are refused unless the actions are constant there; good stats pass."""
    from lf_data import check_action_stats

    x = np.array([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]])
    good = {"q01": [0.0, 1.0], "q99": [2.0, 1.0]}
    check_action_stats(good, "action", "d/meta/stats.json", "q01_q99", x)  # dimension 1 is constant: fine
    cases = [({"q01": [0.66, 0.0], "q99": [-1.0, 1.0]}, "has q01 > q99 in 1 of 2 dimensions: dimension 0"),
             ({"q01": [float("nan"), 0.0], "q99": [1.0, 1.0]}, "['q01'] is not finite in 1 of 2 dimensions: "
                                                               "dimension 0: nan"),
             ({"q01": [0.5, 0.5], "q99": [0.5, 0.5]}, "has zero-width bounds (q01 == q99, bounds = 'q01_q99') in 2 "
                                                      "of 2 dimensions although the actions vary there")]
    for stats, want in cases:
        with pytest.raises(DataError) as err:
            check_action_stats(stats, "action", "d/meta/stats.json", "q01_q99", x)
        assert str(err.value).startswith("d/meta/stats.json: stats['action']") and want in str(err.value)
    with pytest.raises(DataError, match=r"zero-width bounds \(min == max"):
        check_action_stats({"min": [1.0], "max": [1.0]}, "action", "s.json", "min_max")
