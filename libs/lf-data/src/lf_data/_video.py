"""MP4 video frames by integer frame index (PyAV), and a lossless writer for tests and conversion.

Frames are addressed by integer index, never by float timestamp: a decoded
frame's index is ``round((pts - start_pts) * time_base * fps)``, an exact
rational product rounded once, so the ``k``-th frame of a 30 fps file is frame
``k`` whatever the container's time base (LeRobot matches float timestamps with
a tolerance instead, ``tolerance_s = 1e-4``). Legend: ``T`` frames, ``H``/``W``
image size.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from ._errors import DataError

__all__ = ["VideoInfo", "count_frames", "read_video_frames", "video_stream_info", "write_video"]


def _av():
    try:
        import av
    except ImportError as e:  # pragma: no cover - av is a dependency
        raise ImportError("lf-data: reading mp4 video features needs PyAV (pip install av)") from e
    return av


class VideoInfo(tuple):
    """``(frames, fps, height, width)`` of a video file's first video stream, from its header."""

    __slots__ = ()

    def __new__(cls, frames: int, fps: Fraction, height: int, width: int):
        return super().__new__(cls, (frames, fps, height, width))

    frames = property(lambda self: self[0])
    fps = property(lambda self: self[1])
    height = property(lambda self: self[2])
    width = property(lambda self: self[3])


def _open(path: Path, field: str | None, episode: object):
    av = _av()
    if not path.is_file():
        raise DataError(f"{path}: video file missing (episode {episode}, feature {field!r})", file=path,
                        episode=episode, field=field, reason="missing_file")
    try:
        return av.open(str(path))
    except (av.error.FFmpegError, OSError) as e:
        raise DataError(f"{path}: cannot open video (episode {episode}, feature {field!r}): {e}", file=path,
                        episode=episode, field=field, reason="invalid") from e


def count_frames(path: str | Path, *, field: str | None = None, episode: object = None) -> VideoInfo:
    """Frame count, frame rate and size of a video from its container header (``nb_frames``).

    When the header has no frame count (some muxers), the packets are counted
    without decoding.

    Raises:
        DataError: the file is missing (reason ``missing_file``) or not a video (``invalid``).
    """
    path = Path(path)
    with _open(path, field, episode) as c:
        if not c.streams.video:
            raise DataError(f"{path}: no video stream (episode {episode}, feature {field!r})", file=path,
                            episode=episode, field=field, reason="invalid")
        s = c.streams.video[0]
        n = int(s.frames)
        if n <= 0:
            n = sum(1 for p in c.demux(s) if p.size)
        fps = Fraction(s.average_rate) if s.average_rate else Fraction(s.base_rate)
        return VideoInfo(n, fps, int(s.codec_context.height), int(s.codec_context.width))


def video_stream_info(path: str | Path) -> dict:
    """The ``info`` block LeRobot keeps per video feature in ``meta/info.json``, read from the file itself.

    Keys as LeRobot's ``get_video_info`` writes them: ``video.height``, ``video.width``,
    ``video.codec`` (the codec's canonical name, e.g. ``h264``, ``av1``), ``video.pix_fmt``
    (the pixel format of the encoded stream, e.g. ``yuv420p``, or ``gbrp`` for H.264 RGB),
    ``video.is_depth_map`` (False), ``video.fps`` (int), ``video.channels`` (components
    of the pixel format) and ``has_audio``.

    Raises:
        DataError: the file is missing (``missing_file``) or has no video stream (``invalid``).
    """
    av = _av()
    path = Path(path)
    with _open(path, None, None) as c:
        if not c.streams.video:
            raise DataError(f"{path}: no video stream", file=path, reason="invalid")
        s = c.streams.video[0]
        ctx = s.codec_context
        pix_fmt = ctx.pix_fmt
        return {"video.height": int(ctx.height), "video.width": int(ctx.width),
                "video.codec": ctx.codec.canonical_name, "video.pix_fmt": pix_fmt, "video.is_depth_map": False,
                "video.fps": int(s.base_rate), "video.channels": len(av.VideoFormat(pix_fmt).components),
                "has_audio": bool(c.streams.audio)}


def read_video_frames(path: str | Path, indices: Sequence[int], *, fps: float | None = None,
                      field: str | None = None, episode: object = None) -> np.ndarray:
    """Decode the frames at integer ``indices`` of a video to uint8 RGB ``(len(indices), H, W, 3)``.

    Seeks to the key frame before the first wanted frame, then decodes forward
    until the last one, so reading a whole episode in order decodes each frame once.

    Args:
        path: the mp4 (any container/codec FFmpeg reads).
        indices: frame indices into the file, ``0 <= i < frames``, any order, repeats allowed.
        fps: frame rate used to turn pts into indices; default the stream's average rate.
        field / episode: named in errors.

    Raises:
        DataError: missing file (``missing_file``), decode error (``invalid``) or a
            wanted frame past the end of the video (``frame_count``).
    """
    av = _av()
    path = Path(path)
    want = np.asarray(indices, dtype=np.int64)
    if want.size == 0:
        return np.zeros((0, 0, 0, 3), np.uint8)
    lo, hi = int(want.min()), int(want.max())
    if lo < 0:
        raise ValueError(f"{path}: negative frame index {lo}")
    got: dict[int, np.ndarray] = {}
    needed = set(want.tolist())
    with _open(path, field, episode) as c:
        s = c.streams.video[0]
        rate = Fraction(fps).limit_denominator(1_000_000) if fps else Fraction(s.average_rate or s.base_rate)
        tb = Fraction(s.time_base)
        start = s.start_time or 0
        try:
            if lo > 0:  # seek to the key frame at or before frame `lo`
                c.seek(start + int(Fraction(lo) / rate / tb), stream=s, backward=True, any_frame=False)
            for frame in c.decode(s):
                if frame.pts is None:
                    continue
                k = round((frame.pts - start) * tb * rate)
                if k in needed:
                    got[k] = frame.to_ndarray(format="rgb24")
                if k >= hi:
                    break
        except av.error.FFmpegError as e:
            raise DataError(f"{path}: cannot decode video (episode {episode}, feature {field!r}): {e}",
                            file=path, episode=episode, field=field, reason="invalid") from e
    missing = sorted(needed - set(got))
    if missing:
        raise DataError(f"{path}: frame {missing[0]} not in the video (episode {episode}, feature {field!r}; "
                        f"{len(missing)} wanted frames missing, decoded up to frame {max(got, default=-1)})",
                        file=path, episode=episode, field=field, reason="frame_count")
    return np.stack([got[int(i)] for i in want])


def write_video(path: str | Path, frames: np.ndarray, fps: int, *, codec: str = "libx264rgb",
                crf: int = 0) -> Path:
    """Encode uint8 RGB frames ``(T, H, W, 3)`` as an mp4 (default lossless H.264 RGB, ``crf=0``).

    ``libx264rgb`` with ``crf=0`` stores RGB exactly, so a decode returns the input
    bit for bit (tests use this); LeRobot itself writes lossy ``libsvtav1`` yuv420p.
    """
    av = _av()
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height = frames.shape[2], frames.shape[1]
        s.pix_fmt = "rgb24" if codec == "libx264rgb" else "yuv420p"
        s.options = {"crf": str(crf), "preset": "ultrafast"} if codec.startswith("libx264") else {}
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path
