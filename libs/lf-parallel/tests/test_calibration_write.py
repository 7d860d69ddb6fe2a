"""lf-parallel's atomic write (``save_calibration``'s cache file): the mode follows the umask, and the temporary is
unique.

Oracles: the mode a plain ``open`` gives a file under the same umask; a file under the old fixed temporary name
(``cache.tmp``, another writer's) that a save must leave as it was; the calibration read back.
"""

from __future__ import annotations

import os
import stat

import msgspec

from lf_parallel._calibrate import default_calibration, load_calibration, save_calibration
from lf_parallel._cluster import gpu_spec


def test_save_calibration_mode_and_unique_temporary(tmp_path):
    path = tmp_path / "cache.json"
    other = tmp_path / "cache.tmp"
    other.write_text("another writer's half")
    measured = msgspec.structs.replace(default_calibration(gpu_spec("h200")), matmul_tflops=700.0, source="test")
    old = os.umask(0o027)
    try:
        save_calibration(measured, "NVIDIA H200", path)
        (tmp_path / "plain").write_text("")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o640
    assert other.read_text() == "another writer's half"
    assert load_calibration(gpu_spec("h200"), "NVIDIA H200", path) == measured
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "cache.tmp", "plain"]
