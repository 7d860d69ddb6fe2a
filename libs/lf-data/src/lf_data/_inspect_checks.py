"""Checks behind ``inspect_dataset``: stored statistics against the frames, and one report line per broken file.

Stored ``mean``/``std``/``min``/``max`` must equal the statistics of the frames
read (float tolerance). Stored ``q01``/``q99`` are checked by what they do: the
share of the frames' values below ``q01`` (above ``q99``) must be about 1 %, as it
is for the exact quantile; quantiles averaged over episodes (LeRobot 0.4's
``aggregate_stats`` writes per-episode quantiles weighted by length) can leave
10 % or more outside, and the action tokenizer's default ``q01_q99`` bounds then
clip that share of the training actions. Legend: ``N`` frames, ``D`` feature width.
"""

from __future__ import annotations

import numpy as np

from ._errors import DataError

__all__ = ["QUANTILE_FACTOR", "check_stored_stats", "quantile_problems", "report_errors"]

STATS_CHECKED = ("mean", "std", "min", "max")
QUANTILE_FACTOR = 2.0
"""A stored q01 (q99) is wrong when more than ``QUANTILE_FACTOR`` x 1 % of the values lie below (above) it, or
fewer than 1 % / ``QUANTILE_FACTOR`` lie at or below (above) it; one value of slack each way for few frames."""
FILE_REASONS = ("missing_file", "lfs_pointer", "invalid")
"""DataError reasons that concern a whole file (every episode in it fails the same way)."""


def quantile_problems(stored: dict, values: np.ndarray, key: str, where: str,
                      factor: float = QUANTILE_FACTOR) -> list[str]:
    """Problems with ``stored["q01"]`` / ``stored["q99"]`` of feature ``key`` against its frames.

    Args:
        stored: the feature's entry of ``meta/stats.json``.
        values: ``(N, D)`` (or ``(N,)``) values of the frames read.
        key / where: named in the messages (feature, stats file).
        factor: accepted ratio between the share of values beyond the stored quantile and 1 %.

    Returns:
        One message per bad statistic, listing each disagreeing dimension with the share of values beyond the
        stored quantile and the frames' own quantile (numpy's linear method).
    """
    x = np.asarray(values, np.float64).reshape(len(values), -1)
    n = len(x)
    out = []
    for name, q in (("q01", 0.01), ("q99", 0.99)):
        if name not in stored or n == 0:
            continue
        s = np.asarray(stored[name], np.float64).reshape(-1)
        if s.shape != (x.shape[1],):
            out.append(f"{where}: stats[{key!r}][{name!r}] has {s.size} values but the feature has {x.shape[1]} "
                       "dimensions")
            continue
        side = "below" if q < 0.5 else "above"
        beyond = (x < s).mean(0) if q < 0.5 else (x > s).mean(0)
        reach = (x <= s).mean(0) if q < 0.5 else (x >= s).mean(0)
        bad = np.flatnonzero((beyond > 0.01 * factor + 1 / n) | (reach < 0.01 / factor - 1 / n))
        if not bad.size:
            continue
        own = np.quantile(x[:, bad], q, axis=0)
        dims = "; ".join(f"dimension {d}: {s[d]:.4g} has {beyond[d]:.1%} of the values {side} it (the frames' "
                         f"{name}: {o:.4g})" for d, o in zip(bad[:8].tolist(), own[:8].tolist(), strict=True))
        out.append(f"{where}: stats[{key!r}][{name!r}] disagrees with the {n} frames read in "
                   f"{bad.size} of {x.shape[1]} dimensions (about 1% of the values should lie {side} it): {dims}"
                   f"{'; ...' if bad.size > 8 else ''}")
    return out


def check_stored_stats(stored: dict | None, values: dict[str, np.ndarray], recomputed: dict, where: str) -> list[str]:
    """Problems of the stored statistics against the frames: ``mean/std/min/max`` (float tolerance) and ``q01/q99``
    (:func:`quantile_problems`), for every feature that has both stored statistics and frames."""
    if not stored:
        return []
    problems = []
    for key, st in recomputed.items():
        if key not in stored or not isinstance(stored[key], dict):
            continue
        for name in STATS_CHECKED:
            a = np.asarray(stored[key].get(name, []), np.float64).reshape(-1)
            b = np.asarray(st[name], np.float64).reshape(-1)
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-4, atol=1e-6):
                problems.append(f"{where}: stats[{key!r}][{name!r}] = {a.tolist()[:4]} but the raw frames give "
                                f"{b.tolist()[:4]}")
        problems += quantile_problems(stored[key], values[key], key, where)
    return problems


def _episode_list(episodes: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (sorted, runs joined)."""
    runs: list[list[int]] = []
    for e in sorted(set(episodes)):
        if runs and e == runs[-1][-1] + 1:
            runs[-1].append(e)
        else:
            runs.append([e])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def report_errors(errors: list[DataError]) -> list[str]:
    """The messages of ``errors`` in order, a whole-file error once per file, naming the episodes it affects.

    An error is about a whole file when its reason is in :data:`FILE_REASONS` and it has no record: the same
    message for each episode of a shared v3.0 data file or mp4 becomes one line (``episode 3`` -> ``episodes
    0-4``).
    """
    groups: dict[object, list[DataError]] = {}
    for err in errors:
        whole = err.reason in FILE_REASONS and err.file is not None and err.record is None \
            and isinstance(err.episode, int)
        groups.setdefault((err.file, err.reason, err.field) if whole else id(err), []).append(err)
    out = []
    for errs in groups.values():
        text = str(errs[0])
        if len(errs) > 1:
            listed = f"episodes {_episode_list([e.episode for e in errs])}"
            named = f"episode {errs[0].episode}"
            text = text.replace(named, listed, 1) if named in text else f"{text} ({listed})"
        out.append(text)
    return out
