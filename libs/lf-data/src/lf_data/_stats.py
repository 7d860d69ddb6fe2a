"""Feature statistics in the LeRobot ``meta/stats.json`` layout.

Every statistic is computed from all raw frames at once (never averaged from
per-episode values), so ``q01``/``q99`` are exact dataset quantiles.
Legend: ``N`` frames, ``D`` feature width, ``C`` image channels (3).
"""

from __future__ import annotations

import numpy as np

__all__ = ["compute_stats", "image_stats_from_histograms", "pixel_histograms"]

STAT_NAMES = ("mean", "std", "min", "max", "q01", "q99", "count")


def compute_stats(array: np.ndarray) -> dict[str, list[float]]:
    """Per-dimension statistics of a feature over all frames.

    Args:
        array: ``(N, D)`` (or ``(N,)``, treated as ``(N, 1)``) numeric or bool
            values, one row per frame.

    Returns:
        ``{"mean", "std", "min", "max", "q01", "q99"}`` each a list of ``D``
        floats, plus ``"count": [N]``. ``std`` is the population standard
        deviation (``ddof=0``, as LeRobot); ``q01``/``q99`` use
        ``numpy.quantile``'s default linear interpolation. Computed in float64.

    Raises:
        ValueError: ``array`` has no rows or more than 2 dimensions.

    Example:
        >>> compute_stats(np.array([[0.0], [2.0]]))["mean"]
        [1.0]
    """
    a = np.asarray(array)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"array must be (N, D), got shape {a.shape}")
    if a.shape[0] == 0:
        raise ValueError("array has no rows (N=0)")
    a = a.astype(np.float64)
    q01, q99 = np.quantile(a, [0.01, 0.99], axis=0)
    return {
        "mean": a.mean(axis=0).tolist(),
        "std": a.std(axis=0).tolist(),
        "min": a.min(axis=0).tolist(),
        "max": a.max(axis=0).tolist(),
        "q01": q01.tolist(),
        "q99": q99.tolist(),
        "count": [int(a.shape[0])],
    }


def pixel_histograms(images: np.ndarray) -> np.ndarray:
    """256-bin histograms per channel of uint8 images ``(N, H, W, C)`` -> int64 ``(C, 256)``."""
    flat = images.reshape(-1, images.shape[-1])
    return np.stack([np.bincount(flat[:, c], minlength=256) for c in range(flat.shape[1])]).astype(np.int64)


def _hist_quantile(cum: np.ndarray, n: int, q: float) -> float:
    """Exact ``numpy.quantile(method='linear')`` of the sorted values a histogram describes."""
    pos = q * (n - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, n - 1)
    v_lo = int(np.searchsorted(cum, lo, side="right"))
    v_hi = int(np.searchsorted(cum, hi, side="right"))
    return v_lo + (pos - lo) * (v_hi - v_lo)


def image_stats_from_histograms(hist: np.ndarray, num_frames: int) -> dict[str, list]:
    """Per-channel image statistics in [0, 1] from pixel histograms, LeRobot's ``(C, 1, 1)`` layout.

    Args:
        hist: int64 ``(C, 256)`` pixel counts over all frames (see :func:`pixel_histograms`).
        num_frames: ``N``, stored as ``count`` (LeRobot counts frames, not pixels).

    Returns:
        ``mean, std, min, max, q01, q99`` as nested lists of shape ``(C, 1, 1)``
        (pixel value / 255), equal to :func:`compute_stats` of all pixels of a
        channel, and ``count: [N]``.
    """
    values = np.arange(256, dtype=np.float64)
    out: dict[str, list] = {k: [] for k in STAT_NAMES if k != "count"}
    for h in hist:
        n = int(h.sum())
        cum = np.cumsum(h)
        mean = float((h * values).sum() / n)
        var = float((h * (values - mean) ** 2).sum() / n)
        nz = np.nonzero(h)[0]
        per = {
            "mean": mean, "std": var**0.5, "min": float(nz[0]), "max": float(nz[-1]),
            "q01": _hist_quantile(cum, n, 0.01), "q99": _hist_quantile(cum, n, 0.99),
        }
        for k, v in per.items():
            out[k].append([[v / 255.0]])
    out["count"] = [int(num_frames)]
    return out
