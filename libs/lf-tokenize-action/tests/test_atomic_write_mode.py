"""write_json_atomic gives files the mode a plain open() would (0o666 less the umask), not mkstemp's 0o600.

Oracle: the mode of a file made with a plain ``open`` under the same umask, and the JSON read back.
"""

from __future__ import annotations

import os
import stat

import pytest

from lf_tokenize_action._io import current_umask, read_json, write_json_atomic


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_atomic_json_follows_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        out = write_json_atomic(tmp_path / "tok.json", {"a": 1})
        (tmp_path / "plain.json").write_text("{}")
    finally:
        os.umask(old)
    want = stat.S_IMODE((tmp_path / "plain.json").stat().st_mode)
    assert want == 0o666 & ~mask
    assert stat.S_IMODE(out.stat().st_mode) == want
    assert read_json(out) == {"a": 1}
