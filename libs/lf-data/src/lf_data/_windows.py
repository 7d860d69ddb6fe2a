"""Index handling shared by the dataset readers: frame lookup and action-chunk windows.

``action_window`` follows LeRobot's ``delta_timestamps`` convention: steps past the
episode end repeat the last action and are marked as padding.
"""

from __future__ import annotations

import numpy as np


def check_index(i: int, n: int, name: str) -> int:
    """``i`` as a non-negative index into ``n`` frames (negative counts from the end).

    Raises:
        IndexError: naming the dataset class and the range.
    """
    if not -n <= i < n:
        raise IndexError(f"{name} index {i} out of range for {n} frames")
    return int(i) % n


def locate(starts: np.ndarray, i: int) -> tuple[int, int]:
    """(episode, frame within it) of global frame ``i``; ``starts`` are cumulative offsets."""
    e = int(np.searchsorted(starts, i, side="right")) - 1
    return e, i - int(starts[e])


def action_window(t: int, length: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Frame indices ``(horizon,)`` int64 of the chunk at ``t`` (clipped to ``length - 1``) and
    its padding mask ``(horizon,)`` bool (True past the episode end)."""
    want = t + np.arange(horizon)
    return np.minimum(want, length - 1), want >= length
