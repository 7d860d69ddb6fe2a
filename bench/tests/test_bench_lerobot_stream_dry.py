"""``bench/lerobot_stream.py --dry`` and its dataset generator, on the CPU (lerobot not needed).

Oracles: the generator's seeded values (``episode_values``) and the size asked for, for the generated
dataset; the written JSON for the script's run (lf's reader streams every frame; a missing lerobot is
recorded as an error, never as a number).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lf_data import LeRobotDataset, LeRobotStream

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "lerobot_stream.py"


def test_generated_dataset_holds_the_seeded_values(tmp_path, monkeypatch):
    """Oracle: episode_values(episode, length) and the requested size (within 25 %)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # importable by name: the generator's workers unpickle it
    gen = importlib.import_module("lerobot_stream_gen")
    out = gen.generate(tmp_path / "ds", gb=0.003, image=32, episode_len=10, file_mb=1, workers=2)
    assert out["files"] > 1 and abs(out["bytes"] / 0.003e9 - 1) < 0.25
    ds = LeRobotStream(out["root"], action_horizon=3)
    samples = list(ds)
    assert len(samples) == out["frames"] == out["episodes"] * 10
    for s in samples[::7]:
        state, action = gen.episode_values(s["episode_index"], 10)
        t = s["frame_index"]
        np.testing.assert_array_equal(s["state"].numpy(), state[t])
        np.testing.assert_array_equal(s["actions"].numpy(), action[np.minimum(t + np.arange(3), 9)])
        assert s["image"].shape == (32, 32, 3) and s["task"] == gen.TASKS[s["episode_index"] % len(gen.TASKS)]
    mem = LeRobotDataset(out["root"], action_horizon=3, preload_max_bytes=0)
    assert len(mem) == len(samples)
    for i in (0, len(mem) - 1):
        np.testing.assert_array_equal(mem[i]["image"].numpy(), samples[i]["image"].numpy())
    with pytest.raises(FileExistsError, match="not empty"):
        gen.generate(tmp_path / "ds", gb=0.001)


def test_dry_run_writes_results(tmp_path):
    """Oracle: the written JSON; lf's stream reads the whole tiny dataset in both variants."""
    out = tmp_path / "lerobot_stream_dry.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--out", str(out), "--workdir", str(tmp_path / "w")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["benchmark"] == "lerobot_stream" and d["dry"] is True
    assert set(d["runs"]) == {"lf, 1 process", "lf, DataLoader 2 workers", "lerobot, 1 process",
                              "lerobot, DataLoader 2 workers"}
    for name in ("lf, 1 process", "lf, DataLoader 2 workers"):
        r = d["runs"][name]
        assert "error" not in r, r
        assert r["samples"] == d["dataset"]["frames"] and r["whole_dataset"]
        assert r["samples_per_s_per_core"] > 0 and r["peak_rss_anon_mib"] > 0
    lerobot = d["runs"]["lerobot, 1 process"]
    assert ("error" in lerobot) == (importlib.util.find_spec("lerobot") is None)
    assert not (tmp_path / "w").exists()  # the generated dataset is removed without --keep
