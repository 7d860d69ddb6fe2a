"""`python -m lf_orchestrator.results`: a folder that is not a run folder is refused by name; without --out the
result goes into the run folder. Oracle: the files written by hand in the test and the module's documented
contract (exit 2 and one `error:` line naming the path; nothing written where it was not asked)."""

from __future__ import annotations

import json

import pytest

from lf_orchestrator.results import main


def _run_folder(path, steps=5):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 5.0 - s, "step_s": 1.0}) + "\n"
                                                for s in range(1, steps + 1)))
    (path / "summary.json").write_text(json.dumps({"steps": steps, "seconds": 9.0, "eval": {}}))
    return path


def test_a_folder_that_is_not_a_run_folder_is_named(tmp_path, monkeypatch, capsys):
    """A folder without metrics.jsonl and config.toml, and a missing folder: exit 2, the message names the path and
    says why; nothing is written (not even the default output folder)."""
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    assert main([str(other), "--name", "x"]) == 2
    err = capsys.readouterr().err
    assert f"error: {other}: not an `lf run` folder (no metrics.jsonl or config.toml)" in err
    assert main([str(tmp_path / "nowhere"), "--name", "x", "--out", str(tmp_path / "res")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cat.jpg", "photos"]
    run = tmp_path / "started"
    run.mkdir()
    (run / "config.toml").write_text("")  # a run that logged nothing yet: the old message, which now fits
    assert main([str(run), "--name", "x"]) == 2 and "no train/loss record" in capsys.readouterr().err


def test_default_out_is_the_run_folder(tmp_path, monkeypatch, capsys):
    """Without --out: RUN/NAME.json (5 logged steps, loss 4 -> 0) and RUN/NAME_loss.png, nothing under the current
    folder; a second call replaces its own result; a NAME whose JSON is one of the run's files is refused and the
    file is left as it was; --help states the default."""
    monkeypatch.chdir(tmp_path)
    run = _run_folder(tmp_path / "run")
    assert main([str(run), "--name", "demo"]) == 0
    out = json.loads((run / "demo.json").read_text())
    assert (out["steps_logged"], out["first_loss"], out["last_loss"], out["finished"]) == (5, 4.0, 0.0, True)
    assert (run / "demo_loss.png").is_file() and not (tmp_path / "examples").exists()
    assert main([str(run), "--name", "demo", "--set", "device=cpu"]) == 0
    assert json.loads((run / "demo.json").read_text())["device"] == "cpu"
    before = (run / "summary.json").read_text()
    capsys.readouterr()
    assert main([str(run), "--name", "summary"]) == 2
    assert f"{run / 'summary.json'} exists and is not a result" in capsys.readouterr().err
    assert (run / "summary.json").read_text() == before and not (run / "summary_loss.png").exists()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "default: RUN_DIR itself" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("name", ["../escape", "", ".hidden", "sub/x"])
def test_name_must_be_a_plain_file_stem(tmp_path, capsys, name):
    """Oracle: write_results' contract (a plain stem; --out picks the folder): exit 2 naming --name, nothing
    written inside or outside the run folder."""
    run = _run_folder(tmp_path / "run")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main([str(run), "--name", name]) == 2
    assert f"error: --name {name!r}: expected a plain file stem" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
