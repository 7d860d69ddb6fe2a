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

__all__ = ["QUANTILE_FACTOR", "bounds_problems", "check_action_stats", "check_stored_stats", "quantile_problems",
           "report_errors"]

STATS_CHECKED = ("mean", "std", "min", "max")
QUANTILE_FACTOR = 2.0
"""A stored q01 (q99) is wrong when more than ``QUANTILE_FACTOR`` x 1 % of the values lie below (above) it, or
fewer than 1 % / ``QUANTILE_FACTOR`` lie at or below (above) it; one value of slack each way for few frames."""
FILE_REASONS = ("missing_file", "lfs_pointer", "invalid")
"""DataError reasons that concern a whole file (every episode in it fails the same way)."""
BOUND_PAIRS = {"q01_q99": ("q01", "q99"), "min_max": ("min", "max"), "mean_std": ("mean", "std")}
"""Tokenizer ``bounds`` -> the two ``meta/stats.json`` keys it reads (lf_tokenize_action's choices)."""


def _dims(idx: np.ndarray, text) -> str:
    """``text(d)`` for the first 8 dimensions in ``idx``, ``; ``-joined, ``; ...`` when more."""
    return "; ".join(text(d) for d in idx[:8].tolist()) + ("; ..." if idx.size > 8 else "")


def bounds_problems(stored: dict, key: str, where: str) -> list[str]:
    """Stored statistics of feature ``key`` that no normalization can use, one message per finding.

    A non-finite (NaN/inf) value in ``mean/std/min/max/q01/q99``, ``q01 > q99``, ``min > max`` or ``std < 0``;
    each message names ``where`` (the stats file), the feature, the key(s), the dimensions and their values.
    """
    out, vec = [], {}
    for name in ("mean", "std", "min", "max", "q01", "q99"):
        if name not in stored:
            continue
        try:
            vec[name] = np.asarray(stored[name], np.float64).reshape(-1)
        except (TypeError, ValueError):
            out.append(f"{where}: stats[{key!r}][{name!r}] is not a list of numbers: {stored[name]!r}")
            continue
        bad = np.flatnonzero(~np.isfinite(vec[name]))
        if bad.size:
            out.append(f"{where}: stats[{key!r}][{name!r}] is not finite in {bad.size} of {vec[name].size} "
                       f"dimensions: " + _dims(bad, lambda d, v=vec[name]: f"dimension {d}: {v[d]}"))
    for lo, hi in (("q01", "q99"), ("min", "max")):
        a, b = vec.get(lo), vec.get(hi)
        if a is None or b is None or a.shape != b.shape:
            continue
        bad = np.flatnonzero(a > b)
        if bad.size:
            out.append(f"{where}: stats[{key!r}] has {lo} > {hi} in {bad.size} of {a.size} dimensions: "
                       + _dims(bad, lambda d, lo=lo, hi=hi, a=a, b=b: f"dimension {d}: {lo} = {a[d]:.6g} > {hi} = "
                                                                          f"{b[d]:.6g}"))
    if "std" in vec and (vec["std"] < 0).any():
        bad = np.flatnonzero(vec["std"] < 0)
        out.append(f"{where}: stats[{key!r}]['std'] is negative in {bad.size} of {vec['std'].size} dimensions: "
                   + _dims(bad, lambda d: f"dimension {d}: {vec['std'][d]:.6g}"))
    return out


def check_action_stats(stored: dict, key: str, where: str, bounds: str, actions: np.ndarray | None = None) -> None:
    """Refuse stored statistics that would give an action tokenizer unusable ``bounds``.

    Checks the two keys ``bounds`` reads (:data:`BOUND_PAIRS`) with :func:`bounds_problems` (non-finite values,
    lower above upper, negative std) and refuses zero-width bounds (``q01 == q99``, ``min == max``, ``std == 0``)
    in a dimension, unless ``actions`` ``(N, D)`` is given and holds that one value in every frame of the
    dimension (a constant dimension, which the tokenizer reproduces exactly).

    Raises:
        DataError: naming ``where`` (the stats file), ``key`` (the feature), the stats key and the dimensions.
    """
    if bounds not in BOUND_PAIRS:
        return  # unknown bounds: the tokenizer refuses them by name
    lo_key, hi_key = BOUND_PAIRS[bounds]
    pair = {k: stored[k] for k in (lo_key, hi_key) if k in stored}
    problems = bounds_problems(pair, key, where)
    if not problems and len(pair) == 2:
        lo, hi = (np.asarray(pair[k], np.float64).reshape(-1) for k in (lo_key, hi_key))
        width = hi if bounds == "mean_std" else hi - lo
        zero = np.flatnonzero(width == 0) if lo.shape == hi.shape else np.array([], int)
        x = None if actions is None else np.asarray(actions, np.float64).reshape(len(actions), -1)
        if zero.size and x is not None and x.shape[1] == lo.size and len(x):
            zero = np.array([d for d in zero.tolist() if not np.all(x[:, d] == lo[d])], int)
        if zero.size:
            same = f"{hi_key} == 0" if bounds == "mean_std" else f"{lo_key} == {hi_key}"
            vary = " although the actions vary there" if x is not None else ""
            problems.append(
                f"{where}: stats[{key!r}] has zero-width bounds ({same}, bounds = {bounds!r}) in {zero.size} of "
                f"{lo.size} dimensions{vary}: "
                + _dims(zero, lambda d: f"dimension {d}: {lo_key} = {lo[d]:.6g}, {hi_key} = {hi[d]:.6g}")
                + "; every other value would map to an end bin: recompute the statistics (`lf data inspect`)")
    if problems:
        raise DataError("; ".join(problems), file=where, field=key, reason="invalid")


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
        found = bounds_problems(stored[key], key, where)
        problems += found
        unusable = {n for n in ("mean", "std", "min", "max", "q01", "q99") if f"[{key!r}][{n!r}] is not" in
                    " ".join(found)}
        for name in STATS_CHECKED:
            if name in unusable:
                continue
            a = np.asarray(stored[key].get(name, []), np.float64).reshape(-1)
            b = np.asarray(st[name], np.float64).reshape(-1)
            if a.shape != b.shape:
                problems.append(f"{where}: stats[{key!r}][{name!r}] has {a.size} values but the raw frames give "
                                f"{b.size}")
            elif not np.allclose(a, b, rtol=1e-4, atol=1e-6):
                bad = np.flatnonzero(~np.isclose(a, b, rtol=1e-4, atol=1e-6))
                problems.append(f"{where}: stats[{key!r}][{name!r}] differs from the raw frames in {bad.size} of "
                                f"{a.size} dimensions: " + _dims(bad, lambda d, a=a, b=b: f"dimension {d}: stored "
                                                                 f"{a[d]:.6g}, frames {b[d]:.6g}"))
        problems += quantile_problems({k: v for k, v in stored[key].items() if k not in unusable}, values[key], key,
                                      where)
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
