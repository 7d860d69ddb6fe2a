"""lf-orchestrator's atomic writes (``_atomic``): readers see the old or the new file, the file's mode follows the
umask, and every write has its own temporary.

Oracles: the mode a plain ``open`` / ``mkdir`` gives a file / folder under the same umask; the text read back; a
temporary another writer holds under the name the old helpers used (``.NAME.tmp-PID``, ``.loss_curve.tmp.png``),
which a write must leave as it was (before, the second writer overwrote and renamed the first one's file).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from lf_orchestrator._atomic import atomic_dir, atomic_path, write_bytes_atomic
from lf_orchestrator.checkpoint import write_text_atomic
from lf_orchestrator.metrics import plot_loss_curve


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def test_write_text_atomic_mode_follows_umask(tmp_path, umask_027):
    write_text_atomic(tmp_path / "config.toml", "a = 1\n")
    write_bytes_atomic(tmp_path / "b.bin", b"\x00\x01")
    (tmp_path / "plain").write_text("")
    assert _mode(tmp_path / "config.toml") == _mode(tmp_path / "plain") == 0o640
    assert _mode(tmp_path / "b.bin") == 0o640
    assert (tmp_path / "config.toml").read_text() == "a = 1\n" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_atomic_path_and_dir_modes_follow_umask(tmp_path, umask_027):
    """mkstemp / mkdtemp make 0600 / 0700 temporaries; the renamed file / folder has a plain open's / mkdir's mode."""
    with atomic_path(tmp_path / "w.safetensors") as tmp:
        tmp.write_bytes(b"x")
    with atomic_dir(tmp_path / "cache" / "key") as folder:
        (folder / "rows").write_text("r")
    (tmp_path / "plain_dir").mkdir()
    assert _mode(tmp_path / "w.safetensors") == 0o640
    assert _mode(tmp_path / "cache" / "key") == _mode(tmp_path / "plain_dir") == 0o750
    assert (tmp_path / "cache" / "key" / "rows").read_text() == "r"
    assert sorted(p.name for p in tmp_path.rglob(".*")) == []


def test_two_writers_never_share_a_temporary(tmp_path):
    """Another writer (same PID: another thread) is mid-way through ``.config.toml.tmp-PID``; a second write of
    config.toml leaves that file alone, and two open atomic_path blocks of one file hold different temporaries."""
    other = tmp_path / f".config.toml.tmp-{os.getpid()}"
    other.write_text("the other writer's half")
    write_text_atomic(tmp_path / "config.toml", "mine\n")
    assert other.read_text() == "the other writer's half"
    assert (tmp_path / "config.toml").read_text() == "mine\n"
    with atomic_path(tmp_path / "x.json") as a, atomic_path(tmp_path / "x.json") as b:
        assert a != b and a.parent == b.parent == tmp_path and a.name.startswith(".x.json.")
        a.write_text("a")
        b.write_text("b")
    assert (tmp_path / "x.json").read_text() == "a"  # the outer block finished last


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path):
    write_text_atomic(tmp_path / "plan.json", "old")
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "plan.json") as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert (tmp_path / "plan.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_loss_curve_uses_its_own_temporary(tmp_path):
    """A second run writing into the folder holds ``.loss_curve.tmp.png`` (the old fixed name); drawing the curve
    leaves it alone and writes a PNG (its signature)."""
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 1 / s}) + "\n"
                                                    for s in (1, 2, 3)))
    other = tmp_path / ".loss_curve.tmp.png"
    other.write_bytes(b"another writer")
    assert plot_loss_curve(tmp_path) == tmp_path / "loss_curve.png"
    assert other.read_bytes() == b"another writer"
    assert (tmp_path / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".loss_curve.tmp.png", "loss_curve.png", "metrics.jsonl"]
