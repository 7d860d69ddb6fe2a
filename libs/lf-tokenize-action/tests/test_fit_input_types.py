"""fit given a raw action table instead of a stats mapping (BinningTokenizer, FastTokenizer).

Oracles: ``from_actions`` on the same table (numpy's linear quantiles, population
std), and the documented TypeError for values that are neither.
"""

import numpy as np
import pytest

from lf_tokenize_action import BinningTokenizer, FastTokenizer


def _actions(n=500, dim=3, seed=0):
    return np.random.default_rng(seed).normal(size=(n, dim)) * np.array([1.0, 5.0, 0.1])


@pytest.mark.parametrize("bounds", ["q01_q99", "min_max", "mean_std"])
@pytest.mark.parametrize("binning", ["uniform", "quantile"])
def test_binning_fit_accepts_action_table(bounds, binning):
    """BinningTokenizer.fit(actions (N, D)) == from_actions(actions) (was: 'truth value ... is ambiguous')."""
    x = _actions()
    got = BinningTokenizer.fit(x, n_bins=16, bounds=bounds, binning=binning)
    assert got == BinningTokenizer.from_actions(x, n_bins=16, bounds=bounds, binning=binning)
    assert BinningTokenizer.fit(x.tolist(), n_bins=16, bounds=bounds) == BinningTokenizer.from_actions(
        x, n_bins=16, bounds=bounds)


def test_binning_fit_torch_table():
    """A torch (N, D) tensor works like its numpy values."""
    torch = pytest.importorskip("torch")
    x = _actions()
    assert BinningTokenizer.fit(torch.tensor(x)) == BinningTokenizer.from_actions(x)


def test_fast_fit_stats_as_action_table():
    """FastTokenizer.fit(stats=(N, D) table) uses the table's bounds, as fit(stats=mapping of them) does."""
    x = _actions(n=400).reshape(40, 10, 3)
    table = x.reshape(-1, 3)
    q01, q99 = np.quantile(table, (0.01, 0.99), axis=0)
    got = FastTokenizer.fit(x, vocab_size=512, stats=table)
    assert got == FastTokenizer.fit(x, vocab_size=512, stats={"q01": q01.tolist(), "q99": q99.tolist()})


@pytest.mark.parametrize("bad", ["q01", 3.0, None])
def test_fit_rejects_other_types(bad):
    """A string or number as stats is a TypeError naming what is accepted."""
    with pytest.raises(TypeError, match=r"stats must be a stats mapping .* or an \(N, D\) action array; got"):
        BinningTokenizer.fit(bad)
    if bad is not None:  # FAST: stats=None means "from the chunks"
        with pytest.raises(TypeError, match="stats must be a stats mapping"):
            FastTokenizer.fit(_actions(n=40).reshape(4, 10, 1 * 3), vocab_size=512, stats=bad)


def test_binning_fit_action_table_shape_errors():
    """A 1-D or empty table is refused with its shape."""
    with pytest.raises(ValueError, match=r"stats as an action array must have shape \(N, D\).*got shape \(5,\)"):
        BinningTokenizer.fit(np.zeros(5))
