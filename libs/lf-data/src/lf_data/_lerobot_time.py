"""Timestamps of a LeRobot dataset checked against the frame grid ``frame_index / fps``.

lf addresses video frames by integer index: an episode starts at frame
``round(from_timestamp * fps)`` of its mp4 (v3.0, ``videos/<key>/from_timestamp``
in ``meta/episodes``) and its frame ``t`` is the ``t``-th frame after that. A
``from_timestamp`` off the grid by half a frame or more therefore shifts every
frame of the episode by one (its last sample would show the next episode's first
image), and a per-frame ``timestamp`` off its grid point means LeRobot, which
looks frames up by ``from_timestamp + timestamp``, reads another frame than lf.
Both are refused when the drift exceeds ``tolerance_s`` (LeRobot's
``tolerance_s``, default 1e-4 s); a float32 ``timestamp`` column is also allowed
its own rounding (one float32 spacing at the value).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ._errors import DataError

__all__ = ["DEFAULT_TOLERANCE_S", "check_frame_timestamps", "check_tolerance", "check_video_span"]

DEFAULT_TOLERANCE_S = 1e-4
"""Largest accepted distance (seconds) of a timestamp from its frame-grid point, LeRobot's ``tolerance_s``."""


def check_tolerance(tolerance_s: float, owner: str = "tolerance_s") -> float:
    """``tolerance_s`` as a float, or ValueError unless it is a finite number >= 0."""
    if isinstance(tolerance_s, bool) or not isinstance(tolerance_s, (int, float)) or not math.isfinite(tolerance_s) \
            or tolerance_s < 0:
        raise ValueError(f"{owner}: expected a finite number of seconds >= 0, got {tolerance_s!r}")
    return float(tolerance_s)


def check_frame_timestamps(timestamps: np.ndarray, frame_index: np.ndarray, episode_index: np.ndarray, fps: int,
                           tolerance_s: float, *, file: str | Path) -> None:
    """Raise when a frame's ``timestamp`` is farther than ``tolerance_s`` from ``frame_index / fps``.

    Args:
        timestamps: ``(N,)`` seconds as stored (float32 in LeRobot files).
        frame_index / episode_index: ``(N,)`` integers of the same rows.
        fps: the dataset's frame rate.
        tolerance_s: accepted drift in seconds (plus one spacing of the stored float type).
        file: the data file the rows come from (named in the error).

    Raises:
        DataError: reason ``"timestamp"``, naming the file, the first bad row's episode, frame, timestamp and
            drift in seconds, and how many frames (of which episodes) drift.
    """
    ts = np.asarray(timestamps)
    want = np.asarray(frame_index, np.float64) / fps
    slack = np.spacing(np.abs(want).astype(ts.dtype)).astype(np.float64) if ts.dtype.kind == "f" else 0.0
    drift = ts.astype(np.float64) - want
    bad = ~(np.abs(drift) <= tolerance_s + slack)  # NaN timestamps are bad too
    if not bad.any():
        return
    i = int(np.argmax(bad))
    eps = sorted({int(e) for e in np.asarray(episode_index)[bad]})
    shown = ", ".join(str(e) for e in eps[:10]) + (f", ... ({len(eps)} episodes)" if len(eps) > 10 else "")
    ep, t = int(episode_index[i]), int(frame_index[i])
    raise DataError(f"{file}: episode {ep}, frame {t}: timestamp {float(ts[i]):.6f} s is {float(drift[i]):+.6f} s "
                    f"off the frame grid (frame_index / fps = {t}/{fps} = {float(want[i]):.6f} s; tolerance "
                    f"{tolerance_s:g} s); {int(bad.sum())} frame{'s' * (int(bad.sum()) > 1)} drift, in episode"
                    f"{'s' * (len(eps) > 1)} {shown}", file=file, episode=ep, field="timestamp", record=t,
                    reason="timestamp")


def check_video_span(meta_file: str | Path, episode: int, key: str, from_s: float, to_s: float | None, length: int,
                     fps: int, tolerance_s: float) -> None:
    """Raise when an episode's ``videos/<key>/from_timestamp`` (or ``to_timestamp``) is off the frame grid.

    ``from_timestamp`` must lie within ``tolerance_s`` of a multiple of ``1 / fps`` (the episode's first frame
    in the mp4), and ``to_timestamp - from_timestamp`` within ``tolerance_s`` of ``length / fps`` (a start
    moved by whole frames with the end left in place). Seconds are float64, as LeRobot stores them.

    Raises:
        DataError: reason ``"timestamp"``, naming ``meta_file``, the episode, the feature, the frame and the
            drift in seconds.
    """
    name = f"videos/{key}/from_timestamp"
    first = round(from_s * fps) if math.isfinite(from_s) else 0
    drift = from_s - first / fps
    if not abs(drift) <= tolerance_s:
        raise DataError(f"{meta_file}: episode {episode}, frame 0: {name} = {from_s:.6f} s is {drift:+.6f} s off the "
                        f"frame grid of {fps} fps (nearest frame {first} at {first / fps:.6f} s; tolerance "
                        f"{tolerance_s:g} s): the episode's frames would be read from the wrong place in its video",
                        file=meta_file, episode=episode, field=name, record=0, reason="timestamp")
    if to_s is None:
        return
    span = to_s - from_s
    drift = span - length / fps
    if not abs(drift) <= tolerance_s:
        raise DataError(f"{meta_file}: episode {episode}, frame {length}: videos/{key}/to_timestamp - from_timestamp "
                        f"= {to_s:.6f} - {from_s:.6f} = {span:.6f} s but length / fps = {length}/{fps} = "
                        f"{length / fps:.6f} s ({drift:+.6f} s; tolerance {tolerance_s:g} s)", file=meta_file,
                        episode=episode, field=f"videos/{key}/to_timestamp", record=length, reason="timestamp")
