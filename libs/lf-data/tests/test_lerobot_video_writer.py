"""write_lerobot_video: image (PNG) features next to video features, info.json that describes the mp4 streams.

Oracles: the arrays given to the writer (video lossless by default, PNG lossless),
and the mp4 files opened here with PyAV (stream pixel format, codec, size, rate),
which ``meta/info.json`` must match.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

av = pytest.importorskip("av")

from lf_data._lerobot_stream import LeRobotStream  # noqa: E402
from lf_data._lerobot_video_writer import write_lerobot_video  # noqa: E402

CAM, WRIST = "observation.images.top", "observation.images.wrist"
FEATURES = {
    CAM: {"dtype": "video", "shape": [16, 16, 3]},
    WRIST: {"dtype": "image", "shape": [8, 8, 3]},
    "observation.state": {"dtype": "float32", "shape": [3]},
    "action": {"dtype": "float32", "shape": [2]},
}
VIDEO_ONLY = {k: ft for k, ft in FEATURES.items() if k != WRIST}


def _episodes(lengths=(4, 6), seed=0):
    rng = np.random.default_rng(seed)
    return [{"task": "stack", "frames": {
        CAM: rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8),
        WRIST: rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
        "action": rng.normal(size=(n, 2)).astype(np.float32)}} for n in lengths]


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_video_and_image_features_together(tmp_path, version):
    """One camera as mp4, one as PNG-in-parquet: both read back exactly with lf's reader (was: compute_stats error)."""
    eps = _episodes()
    root = write_lerobot_video(tmp_path / "ds", eps, version=version, fps=10, features=FEATURES)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"][CAM]["dtype"] == "video" and info["features"][WRIST]["dtype"] == "image"
    ds = LeRobotStream(root, image_key=CAM, delta_timestamps={WRIST: [0.0]})
    samples = list(ds)
    frames = [(e, t) for e, ep in enumerate(eps) for t in range(len(ep["frames"]["action"]))]
    assert len(samples) == len(frames)
    for s, (e, t) in zip(samples, frames, strict=True):
        np.testing.assert_array_equal(s["image"].numpy(), eps[e]["frames"][CAM][t])
        np.testing.assert_array_equal(s[WRIST].numpy()[0], eps[e]["frames"][WRIST][t])
    stats = json.loads((root / "meta/stats.json").read_text()) if version == "v3.0" else None
    if stats is not None:  # image stats per channel in [0, 1], as for the video feature
        want = np.concatenate([ep["frames"][WRIST] for ep in eps]).reshape(-1, 3).mean(axis=0) / 255
        np.testing.assert_allclose(np.ravel(stats[WRIST]["mean"]), want, rtol=1e-6)


@pytest.mark.parametrize(("version", "codec", "pix_fmt"), [
    ("v3.0", "libx264rgb", "gbrp"), ("v2.1", "libx264rgb", "gbrp"), ("v3.0", "libx264", "yuv420p")])
def test_info_json_matches_the_mp4_streams(tmp_path, version, codec, pix_fmt):
    """Every mp4's stream (opened here with PyAV) has the pix_fmt, codec, size and fps that info.json states.

    libx264rgb with rgb24 input encodes planar GBR (gbrp); info.json said rgb24 before.
    """
    kwargs = {} if codec == "libx264rgb" else {"video_codec": codec}  # the default codec is libx264rgb
    root = write_lerobot_video(tmp_path / "ds", _episodes(), version=version, fps=10, features=VIDEO_ONLY, **kwargs)
    vinfo = json.loads((root / "meta/info.json").read_text())["features"][CAM]["info"]
    mp4s = sorted(root.glob(f"videos/**/{CAM}/*.mp4")) or sorted(root.glob(f"videos/{CAM}/**/*.mp4"))
    assert len(mp4s) == (2 if version == "v2.1" else 1)
    for mp4 in mp4s:
        with av.open(str(mp4)) as c:
            s = c.streams.video[0]
            assert s.codec_context.pix_fmt == pix_fmt == vinfo["video.pix_fmt"]
            assert s.codec_context.codec.canonical_name == "h264" == vinfo["video.codec"]
            assert (s.codec_context.height, s.codec_context.width) == (16, 16)
            assert (vinfo["video.height"], vinfo["video.width"]) == (16, 16)
            assert int(s.base_rate) == vinfo["video.fps"] == 10
            assert vinfo["video.channels"] == 3 and vinfo["has_audio"] is (len(c.streams.audio) > 0) is False


def test_failed_write_leaves_nothing(tmp_path):
    """A frame array of the wrong shape in episode 1 raises and leaves neither out_dir nor a temporary folder."""
    eps = _episodes()
    eps[1]["frames"]["action"] = np.zeros((6, 5), np.float32)
    with pytest.raises(ValueError, match="'action' has shape"):
        write_lerobot_video(tmp_path / "ds", eps, version="v2.1", fps=10, features=VIDEO_ONLY)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="video_codec must be one of"):
        write_lerobot_video(tmp_path / "ds", _episodes(), version="v3.0", fps=10, features=FEATURES, video_codec="x")
