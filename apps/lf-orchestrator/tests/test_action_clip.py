"""The action tokenizer's clipped share of the training actions: `lf run` stops (or warns) past
``action_tokenizer.max_clipped_fraction``. Datasets are written by ``lf_data.write_lerobot_v3``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lf_data import LeRobotDataset, write_lerobot_v3
from lf_orchestrator.config import ConfigError, load_config
from lf_orchestrator.families.vla import assembly
from lf_orchestrator.families.vla._action_clip import ClippedActionsWarning, clipped_fractions

LENGTHS = (40, 60, 50, 70)


@pytest.fixture
def offset_dataset(tmp_path):
    """Four episodes whose actions sit around different means in dimensions 0 and 2 (dimension 1 is shared)."""
    rng = np.random.default_rng(3)
    episodes = [{"task": "reach the goal", "frames": {
        "observation.image": rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
        "action": (rng.normal(size=(n, 3)) * 0.1 + [e - 1.5, 0.0, 2.0 * e]).astype(np.float32)}}
        for e, n in enumerate(LENGTHS)]
    root = write_lerobot_v3(tmp_path / "ds", episodes, fps=10, features={
        "observation.image": {"dtype": "image", "shape": [8, 8, 3]},
        "observation.state": {"dtype": "float32", "shape": [2]}, "action": {"dtype": "float32", "shape": [3]}})
    return root, [e["frames"]["action"].astype(np.float64) for e in episodes]


def _average_quantiles_per_episode(root, actions) -> dict:
    """Rewrite stats.json's action q01/q99 as the length-weighted mean of per-episode quantiles (as lerobot 0.4's
    aggregate_stats and some converters write them); returns the new action entry."""
    path = root / "meta/stats.json"
    stats = json.loads(path.read_text())
    n = np.array([len(a) for a in actions], np.float64)
    for name, q in (("q01", 0.01), ("q99", 0.99)):
        per_episode = np.stack([np.quantile(a, q, axis=0) for a in actions])
        stats["action"][name] = ((per_episode * n[:, None]).sum(0) / n.sum()).tolist()
    path.write_text(json.dumps(stats))
    return stats["action"]


def _cfg(root, *sets):
    return load_config(None, ["data.source='lerobot'", f"data.path='{root}'", "data.tasks=['*']",
                              "data.image_size=8", *sets])


def test_clipped_fractions_per_dimension():
    """Oracle: numpy counts of values outside [low, high]; a pass-through dimension clips outside [-1, 1]."""
    a = np.array([[0.0, 5.0, -2.0], [1.0, -5.0, 0.5], [2.0, 0.0, 3.0], [3.0, 0.5, 0.0]])
    low, high = np.array([0.5, -1.0, 0.0]), np.array([2.5, 1.0, 1.0])
    np.testing.assert_array_equal(clipped_fractions(a, low, high), [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(clipped_fractions(a, low, high, np.array([True, False, True])), [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(clipped_fractions(a, low, high, np.array([False, True, False])), [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(clipped_fractions(a[:, :1], np.array([-1.0]), np.array([1.0]),
                                                    np.array([False])), [0.5])


def test_run_stops_when_the_tokenizer_clips_the_training_actions(offset_dataset):
    """Oracle: numpy shares of the training actions outside the stored q01/q99 (per-episode averages: over 90% in
    dimensions 0 and 2). lf run's encoder build refuses them naming those dimensions and fractions (it trained
    with most targets in the end bins); "warn" warns and builds; the writer's exact quantiles pass."""
    root, actions = offset_dataset
    dataset = LeRobotDataset(root, action_horizon=4)
    assembly.build_encoder(_cfg(root), dataset)  # exact quantiles: about 2% clipped per dimension
    entry = _average_quantiles_per_episode(root, actions)
    dataset = LeRobotDataset(root, action_horizon=4)
    all_actions = np.concatenate(actions)
    share = ((all_actions < entry["q01"]) | (all_actions > entry["q99"])).mean(0)
    assert share[0] > 0.9 and share[2] > 0.9 and share[1] * 220 <= 0.05 * 220 + 2
    with pytest.raises(ConfigError) as err:
        assembly.build_encoder(_cfg(root), dataset)
    msg = str(err.value)
    assert msg.startswith("action_tokenizer.max_clipped_fraction: the action tokenizer clips more than 5.0% of the "
                          "220 training actions in 2 of 3 dimensions (dimension 0: ")
    assert f"dimension 0: {share[0]:.1%}" in msg and f"dimension 2: {share[2]:.1%}" in msg
    assert "dimension 1" not in msg and str(root / "meta/stats.json") in msg
    with pytest.warns(ClippedActionsWarning, match=r"in 2 of 3 dimensions \(dimension 0: "):
        encoder = assembly.build_encoder(_cfg(root, "action_tokenizer.on_clipped='warn'"), dataset)
    assert encoder.action_tokenizer.action_dim == 3
    assembly.build_encoder(_cfg(root, "action_tokenizer.max_clipped_fraction=1.0"), dataset)  # 1: no check
    assembly.build_encoder(_cfg(root, "action_tokenizer.bounds='min_max'"), dataset)


def test_max_clipped_fraction_range_is_checked(offset_dataset):
    """Oracle: the documented range [0, 1] and the two policies."""
    root, _ = offset_dataset
    with pytest.raises(ConfigError, match=r"action_tokenizer.max_clipped_fraction: expected a number in \[0, 1\], "
                                          r"got 1.5"):
        _cfg(root, "action_tokenizer.max_clipped_fraction=1.5")
    with pytest.raises(ConfigError, match="action_tokenizer.on_clipped"):
        _cfg(root, "action_tokenizer.on_clipped='ignore'")


def test_exact_quantiles_clip_message_does_not_blame_the_stats(offset_dataset):
    """Oracle: the writer's exact q01/q99 (numpy's quantiles of all 220 actions), which lf data inspect's check
    passes: with max_clipped_fraction=0.001 the stop says the bounds clip that share by definition and offers the
    remedies, and no longer claims the stored statistics disagree with the data (they do not)."""
    root, _ = offset_dataset
    dataset = LeRobotDataset(root, action_horizon=4)
    with pytest.raises(ConfigError) as err:
        assembly.build_encoder(_cfg(root, "action_tokenizer.max_clipped_fraction=0.001"), dataset)
    msg = str(err.value)
    assert "disagree" not in msg and "whose statistics agree with the data" in msg
    assert "clip that share by definition (q01/q99 leave about 1% out on each side)" in msg
    assert 'on_clipped = "warn"' in msg and 'bounds = "min_max"' in msg and "max_clipped_fraction" in msg


def _set_action_stats(root, **values) -> str:
    path = root / "meta/stats.json"
    stats = json.loads(path.read_text())
    stats["action"].update(values)
    path.write_text(json.dumps(stats))
    return str(path)


@pytest.mark.parametrize(("values", "want"), [
    ({"q01": [0.66, -1.0, -1.0], "q99": [-1.0, 1.0, 9.0]},
     "stats['action'] has q01 > q99 in 1 of 3 dimensions: dimension 0: q01 = 0.66 > q99 = -1"),
    ({"q01": [float("nan"), -1.0, -1.0]}, "stats['action']['q01'] is not finite in 1 of 3 dimensions: "
                                          "dimension 0: nan"),
    ({"q01": [0.5, 0.5, 0.5], "q99": [0.5, 0.5, 0.5]},
     "stats['action'] has zero-width bounds (q01 == q99, bounds = 'q01_q99') in 3 of 3 dimensions although the "
     "actions vary there: dimension 0: q01 = 0.5, q99 = 0.5"),
])
def test_unusable_stored_bounds_are_refused_naming_the_file(offset_dataset, tmp_path, values, want):
    """Oracle: the tampered meta/stats.json cells. lf run (data.source=lerobot) and lf tokenize fit both refuse
    them naming the stats file, the feature 'action', the key and the dimension (they said "low must be <= high
    elementwise" / "stats['q01'] must be finite" without a file, and zero-width bounds passed silently)."""
    from typer.testing import CliRunner

    from lf_orchestrator.cli import app

    root, _ = offset_dataset
    path = _set_action_stats(root, **values)
    with pytest.raises(ConfigError) as err:
        assembly.build_encoder(_cfg(root), LeRobotDataset(root, action_horizon=4))
    assert str(err.value).startswith(f"action_tokenizer.bounds: {path}: ") and want in str(err.value)
    res = CliRunner().invoke(app, ["tokenize", "fit", str(root), "--out", str(tmp_path / "t.json")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"{path}: " in text and " ".join(want.split()) in text, text
