"""Stop (or warn about) a run whose action tokenizer clips a large share of its own training actions.

The binning and FAST tokenizers map ``[low, high]`` (from the dataset's stored
statistics, ``action_tokenizer.bounds``) to ``[-1, 1]`` and clip what lies
outside. Exact ``q01``/``q99`` clip about 2 % of the values of a dimension; stored
quantiles that were averaged over episodes can clip most of them (a clipped
fraction of 1.0 makes every target the end bin), which trains a policy that
cannot express the data. ``action_tokenizer.max_clipped_fraction`` bounds the
share per dimension and ``action_tokenizer.on_clipped`` says whether a larger one
is an error or a warning. Legend: ``N`` frames, ``D`` action dimensions.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from lf_orchestrator.config import ActionTokenizerSection, ConfigError

__all__ = ["ClippedActionsWarning", "check_clipped_actions", "clipped_fractions"]


class ClippedActionsWarning(UserWarning):
    """``action_tokenizer.on_clipped = "warn"``: the tokenizer clips more training actions than allowed."""


def clipped_fractions(actions: np.ndarray, low: np.ndarray, high: np.ndarray,
                      normalize_mask: np.ndarray | None = None) -> np.ndarray:
    """Share of the values of each dimension that the tokenizer clips, float64 ``(D,)``.

    Args:
        actions: ``(N, D)`` training actions, action units.
        low / high: ``(D,)`` the tokenizer's bounds; a value outside ``[low, high]`` is clipped.
        normalize_mask: ``(D,)`` bool, False for dimensions passed through unnormalized (clipped outside
            ``[-1, 1]``); default all True.
    """
    a = np.asarray(actions, np.float64).reshape(len(actions), -1)
    mask = np.ones(a.shape[1], bool) if normalize_mask is None else np.asarray(normalize_mask, bool)
    out = np.where(mask, (a < low) | (a > high), (a < -1.0) | (a > 1.0))
    return out.mean(axis=0) if len(a) else np.zeros(a.shape[1])


def _stats_verdict(tok: ActionTokenizerSection, stats: dict | None, actions: np.ndarray, where: str) -> str | None:
    """The stored statistics' problems with ``actions`` or None when they agree (q01/q99:
    ``lf_data.quantile_problems``, the check of ``lf data inspect``; min/max: no value outside them)."""
    from lf_data import quantile_problems

    if stats is None:
        return None
    if tok.bounds == "q01_q99":
        found = quantile_problems(stats, actions, "action", where)
        return "; ".join(found) if found else None
    a = np.asarray(actions, np.float64).reshape(len(actions), -1)
    lo, hi = np.asarray(stats["min"], np.float64), np.asarray(stats["max"], np.float64)
    out = np.flatnonzero((a < lo).any(0) | (a > hi).any(0))
    return (f"{where}: stats['action']['min'/'max'] do not contain the training actions in dimensions "
            f"{out[:8].tolist()}") if out.size else None


def check_clipped_actions(tok: ActionTokenizerSection, tokenizer, actions: np.ndarray, dataset: Path,
                          stats: dict | None = None) -> np.ndarray:
    """Clipped fractions of ``actions`` under ``tokenizer``; ConfigError (or a warning) past the allowed share.

    A dimension fails when it clips more than ``max_clipped_fraction * N + 2`` values: the two are one value
    at each bound, which the interpolated quantiles of few frames clip by construction. The message says the
    stored statistics disagree with the data only when they do (``stats`` checked against ``actions`` as
    ``lf data inspect`` checks them); otherwise that the bounds themselves clip that share.

    Args:
        tok: the ``action_tokenizer`` section (``max_clipped_fraction``, ``on_clipped``, ``bounds``).
        tokenizer: the fitted binning or FAST tokenizer (``low``, ``high``, ``normalize_mask``).
        actions: ``(N, D)`` the training frames' actions.
        dataset: the dataset folder, named in the message.
        stats: the ``action`` entry of the dataset's ``meta/stats.json`` the bounds came from (None: not judged).

    Returns:
        float64 ``(D,)`` the clipped fraction of each dimension.

    Raises:
        ConfigError: ``on_clipped = "error"`` and a dimension clips too much; the message names the dimensions,
            their clipped fractions, the bounds and the remedies.

    Warns:
        ClippedActionsWarning: the same message with ``on_clipped = "warn"``.
    """
    frac = clipped_fractions(actions, tokenizer.low, tokenizer.high, getattr(tokenizer, "normalize_mask", None))
    n = len(actions)
    bad = np.flatnonzero(frac * n > tok.max_clipped_fraction * n + 2)
    if not bad.size:
        return frac
    dims = ", ".join(f"dimension {d}: {frac[d]:.1%} (bounds [{tokenizer.low[d]:.4g}, {tokenizer.high[d]:.4g}])"
                     for d in bad[:8].tolist()) + (", ..." if bad.size > 8 else "")
    where = dataset / "meta/stats.json"
    head = (f"action_tokenizer.max_clipped_fraction: the action tokenizer clips more than "
            f"{tok.max_clipped_fraction:.1%} of the {n} training actions in {bad.size} of {len(frac)} dimensions "
            f"({dims}); its bounds come from {where} (bounds = {tok.bounds!r}), ")
    verdict = _stats_verdict(tok, stats, actions, str(where))
    if verdict is not None:
        msg = (head + f"whose statistics disagree with the data (see `lf data inspect {dataset}`): recompute them, "
               f"use bounds = \"min_max\", raise action_tokenizer.max_clipped_fraction, or set "
               f"action_tokenizer.on_clipped = \"warn\"")
    else:
        agree = "" if stats is None else "whose statistics agree with the data; "
        why = " (q01/q99 leave about 1% out on each side)" if tok.bounds == "q01_q99" else ""
        msg = (head + f"{agree}these bounds clip that share by definition{why}: raise "
               f"action_tokenizer.max_clipped_fraction, set action_tokenizer.on_clipped = \"warn\", or use wider "
               f"bounds (bounds = \"min_max\")")
    if tok.on_clipped == "warn":
        warnings.warn(msg, ClippedActionsWarning, stacklevel=2)
        return frac
    raise ConfigError(msg)
