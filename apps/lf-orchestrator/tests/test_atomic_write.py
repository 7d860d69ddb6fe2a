"""checkpoint.write_text_atomic: readers see the old or the new file, and the file's mode follows the umask.

Oracle: the mode a plain ``open`` gives a file under the same umask; the text read back.
"""

from __future__ import annotations

import os
import stat

from lf_orchestrator.checkpoint import write_text_atomic


def test_write_text_atomic_mode_follows_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "config.toml", "a = 1\n")
        (tmp_path / "plain").write_text("")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "config.toml").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    assert (tmp_path / "config.toml").read_text() == "a = 1\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
