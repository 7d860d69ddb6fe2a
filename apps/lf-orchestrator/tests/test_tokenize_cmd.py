"""`lf tokenize fit|encode|decode|report` through Typer's CliRunner.

Oracles: the library calls on the same data (BinningTokenizer / FastTokenizer
fitted and applied in-process), the dataset's meta/stats.json, and the
documented file layouts (.npy bins, FAST tokens padded with -1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from lf_orchestrator.tokenize_cmd import make_chunks, read_actions, tokenize_app
from lf_tokenize_action import BinningTokenizer, FastTokenizer

app = typer.Typer()
app.add_typer(tokenize_app, name="tokenize")
runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["tokenize", *map(str, args)])


def test_fit_binning_uses_stats_and_round_trips(tmp_path, dataset_dir):
    """fit --kind binning equals BinningTokenizer.fit(stats); encode/decode .npy equal the library's output."""
    path = tmp_path / "bin.json"
    res = _run("fit", dataset_dir, "--out", path, "--n-bins", "64")
    assert res.exit_code == 0, res.output
    stats = json.loads((dataset_dir / "meta" / "stats.json").read_text())["action"]
    assert BinningTokenizer.load(path) == BinningTokenizer.fit(stats, n_bins=64)
    episodes, _ = read_actions(dataset_dir)
    x = np.concatenate(episodes)[:50]
    np.save(tmp_path / "x.npy", x)
    assert _run("encode", path, tmp_path / "x.npy", tmp_path / "b.npy").exit_code == 0
    bins = np.load(tmp_path / "b.npy")
    tok = BinningTokenizer.load(path)
    np.testing.assert_array_equal(bins, tok.encode(x))
    assert _run("decode", path, tmp_path / "b.npy", tmp_path / "y.npy").exit_code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), tok.decode(bins))


def test_fit_fast_encode_decode_and_errors(tmp_path, dataset_dir):
    """fit --kind fast gives the library's tokenizer; tokens .npy is padded with -1; a truncated row exits 2."""
    path = tmp_path / "fast.json"
    res = _run("fit", dataset_dir, "--out", path, "--kind", "fast", "--horizon", "8", "--vocab-size", "512")
    assert res.exit_code == 0, res.output
    episodes, stats = read_actions(dataset_dir)
    chunks = make_chunks(episodes, 8, 1)
    assert FastTokenizer.load(path) == FastTokenizer.fit(chunks, vocab_size=512, stats=stats)
    np.save(tmp_path / "c.npy", chunks[:5])
    assert _run("encode", path, tmp_path / "c.npy", tmp_path / "t.npy").exit_code == 0
    tokens = np.load(tmp_path / "t.npy")
    tok = FastTokenizer.load(path)
    expected = tok.encode(chunks[:5])
    assert tokens.shape == (5, max(map(len, expected)))
    assert [row[row != -1].tolist() for row in tokens] == expected
    assert _run("decode", path, tmp_path / "t.npy", tmp_path / "y.npy").exit_code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), tok.decode(expected))
    bad = tokens.copy()
    bad[0, :] = -1  # an empty sequence
    np.save(tmp_path / "bad.npy", bad)
    res = _run("decode", path, tmp_path / "bad.npy", tmp_path / "z.npy")
    assert res.exit_code == 2 and "token sequence 0" in res.output
    res = _run("decode", path, tmp_path / "bad.npy", tmp_path / "z.npy", "--on-error", "mask")
    assert res.exit_code == 0 and np.isnan(np.load(tmp_path / "z.npy")[0]).all()


def test_report_json(dataset_dir):
    """report --json lists both binnings and every FAST config whose alphabet fits; errors are consistent."""
    res = _run("report", dataset_dir, "--horizon", "8", "--scales", "10,50", "--vocab-sizes", "512", "--json")
    assert res.exit_code == 0, res.output
    rows = {r["tokenizer"]: r for r in json.loads(res.output)}
    assert set(rows) == {"binning uniform n_bins=256", "binning quantile n_bins=256",
                         "FAST scale=10 vocab=512", "FAST scale=50 vocab=512"}
    assert rows["binning uniform n_bins=256"]["tokens_per_chunk"] == 8 * 4  # H * D, Meta-World D = 4
    assert rows["FAST scale=10 vocab=512"]["tokens_per_chunk"] < 32
    # Nested scales: 50 is never worse than 10 on the same chunks (see the library's property test).
    assert rows["FAST scale=50 vocab=512"]["mae_normalized"] <= rows["FAST scale=10 vocab=512"]["mae_normalized"]


@pytest.mark.parametrize(("args", "match"), [
    (["fit", "{d}", "--out", "{t}/x.json", "--kind", "vq"], "--kind must be 'binning' or 'fast'"),
    (["fit", "{t}", "--out", "{t}/x.json"], "is not a LeRobot v3.0 dataset"),
    (["fit", "{d}", "--out", "{t}/x.json", "--kind", "fast", "--vocab-size", "4"], "vocab_size must be >="),
])
def test_errors_exit_2(tmp_path, dataset_dir, args, match):
    """Bad options give exit code 2 and a message naming the problem."""
    res = _run(*[a.format(d=dataset_dir, t=tmp_path) for a in args])
    assert res.exit_code == 2 and match in res.output.replace("\n", "")


def test_report_shows_fast_reconstruction_error_per_dimension(dataset_dir):
    """report lists each FAST config's own reconstruction error per action dimension (max abs / RMS).

    Oracle: FastTokenizer.fit on the same training chunks (episodes e % 5 != 4, all when fewer than 5),
    whose reconstruction_error is decode(encode(x)) - x on those chunks.
    """
    res = _run("report", dataset_dir, "--horizon", "8", "--scales", "10", "--vocab-sizes", "512", "--json")
    assert res.exit_code == 0, res.output
    row = next(r for r in json.loads(res.output) if r["tokenizer"] == "FAST scale=10 vocab=512")
    episodes, stats = read_actions(dataset_dir)
    train = [e for i, e in enumerate(episodes) if i % 5 != 4] if len(episodes) >= 5 else episodes
    chunks = make_chunks(train, 8, 1)
    tok = FastTokenizer.fit(chunks, scale=10, vocab_size=512, stats=stats)
    err = tok.decode(tok.encode(chunks)) - chunks
    np.testing.assert_allclose(row["fit_max_abs"], np.abs(err).max(axis=(0, 1)), rtol=1e-12)
    np.testing.assert_allclose(row["fit_rms"], np.sqrt((err**2).mean(axis=(0, 1))), rtol=1e-12)
    assert len(row["fit_max_abs"]) == 4  # Meta-World D = 4
    res = _run("report", dataset_dir, "--horizon", "8", "--scales", "10", "--vocab-sizes", "512")
    assert res.exit_code == 0, res.output
    text = res.output
    assert "FAST fit error per action dimension" in text and all(f"dim {d}" in text for d in range(4))
    m, s = row["fit_max_abs"][3], row["fit_rms"][3]
    assert f"{m:.3g} / {s:.3g}" in text


def test_fit_fast_prints_error_and_enforces_tolerance(tmp_path, dataset_dir):
    """fit --kind fast prints the per-dimension error; --max-reconstruction-error below it exits 2 naming the dim.

    Oracle: the saved tokenizer's reconstruction_error.
    """
    path = tmp_path / "fast.json"
    res = _run("fit", dataset_dir, "--out", path, "--kind", "fast", "--horizon", "8", "--vocab-size", "512")
    assert res.exit_code == 0, res.output
    err = FastTokenizer.load(path).reconstruction_error
    assert err is not None and f"dim 3: max abs {err.max_abs[3]:.4g}, RMS {err.rms[3]:.4g}" in res.output
    res = _run("fit", dataset_dir, "--out", tmp_path / "f2.json", "--kind", "fast", "--horizon", "8",
               "--vocab-size", "512", "--max-reconstruction-error", f"{err.max_abs.min() / 2}")
    assert res.exit_code == 2 and "reconstruction error of action dimension" in res.output.replace("\n", "")
    assert not (tmp_path / "f2.json").exists()


def test_report_lists_fast_configs_that_cannot_be_fitted(dataset_dir):
    """A FAST scale whose coefficients do not fit is reported (JSON row and table note), never dropped.

    Oracle: FastTokenizer.fit on the same training chunks raises CoefficientRangeError at scale 1e6
    (coefficients up to sqrt(8) * 1e6, far beyond the alphabet); its class name and message must appear.
    """
    from lf_tokenize_action import CoefficientRangeError

    episodes, stats = read_actions(dataset_dir)
    train = [e for i, e in enumerate(episodes) if i % 5 != 4] if len(episodes) >= 5 else episodes
    with pytest.raises(CoefficientRangeError) as info:
        FastTokenizer.fit(make_chunks(train, 8, 1), scale=1e6, vocab_size=512, stats=stats)
    res = _run("report", dataset_dir, "--horizon", "8", "--scales", "1e6,10", "--vocab-sizes", "512", "--json")
    assert res.exit_code == 0, res.output
    rows = {r["tokenizer"]: r for r in json.loads(res.output)}
    bad = rows["FAST scale=1e+06 vocab=512"]
    assert bad["error"] == f"CoefficientRangeError: {info.value}"
    assert bad["tokens_per_chunk"] is bad["mae_normalized"] is bad["mae_action"] is bad["clipped"] is None
    assert "error" not in rows["FAST scale=10 vocab=512"]
    res = _run("report", dataset_dir, "--horizon", "8", "--scales", "1e6,10", "--vocab-sizes", "512")
    assert res.exit_code == 0, res.output
    text = res.output.replace("\n", "")
    assert "FAST scale=1e+06 vocab=512" in text and "not fitted" in text
    assert f"FAST scale=1e+06 vocab=512: not fitted: CoefficientRangeError: {info.value}" in text
