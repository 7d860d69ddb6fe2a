"""docs/adding-a-model.md, executed: its Python blocks run in order in one namespace (they define and register the
guide's `tinylm` recipe and use it), then every ``$ lf ...`` line of its console blocks runs through the CLI in
this process, where the recipe is registered; a line marked ``# exit N`` must exit N, the others 0.

Oracle: the guide's own assertions (the built model's parameters equal the IR's count, the logits' shape) and
each command's exit status and output: `lf run` leaves a checkpoint and finite losses for the two steps it was
asked for, `lf parallel check --dry-run` prints the resolved plan, the refused plan names the head count.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "adding-a-model.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(), flags=re.S)


@pytest.fixture
def guide_recipe():
    """The guide's Python blocks run in order; the recipe they register is removed afterwards."""
    from lf_ir import recipe_names, unregister_recipe

    namespace: dict = {}
    try:
        for block in _blocks("python"):
            exec(compile(block, f"{GUIDE}:python", "exec"), namespace)  # noqa: S102 (the repository's own guide)
        assert "tinylm" in recipe_names()
        yield namespace
    finally:
        if "tinylm" in recipe_names():
            unregister_recipe("tinylm")


def test_the_guide_runs_as_written(guide_recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = [line.strip()[2:] for block in _blocks("console") for line in block.splitlines()
             if line.strip().startswith("$ lf ")]
    assert len(lines) >= 6, lines
    for line in lines:
        command, _, comment = line.partition("#")
        want = int(comment.split()[-1]) if comment.strip().startswith("exit") else 0
        args = shlex.split(command)[1:]
        if args[:2] == ["parallel", "check"]:
            args += ["--cache-dir", str(tmp_path / "check-cache"), "--work-dir", str(tmp_path / "check-work")]
        if args[0] == "run":
            args[1] = str(ROOT / args[1])
            args += ["--set", f"corpus.cache_dir='{tmp_path / 'corpus'}'"]
        out = CliRunner().invoke(app, args)
        text = " ".join(out.output.split())
        assert out.exit_code == want, (line, text[-3000:])
        if args[0] == "run":
            (run,) = (tmp_path / "guide-runs").iterdir()
            rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
            losses = [r["train/loss"] for r in rows if "train/loss" in r]
            assert len(losses) == 2 and all(math.isfinite(x) for x in losses), rows
            assert (run / "checkpoints" / "latest").read_text() == "step-00000002"
            assert json.loads((run / "plan.json").read_text())["plan"].startswith("dp=1")
        if "--dry-run" in args and want == 0:
            assert "plan (--plan):" in text, text
        if want == 2:
            assert "does not divide kv_heads=2" in text, text


def test_the_worked_example_gemma_trains_with_no_orchestrator_edit(tmp_path):
    """gemma (registered by lf-ir alone, family llm) trains through `lf run` under the llm family: 3 steps with
    finite, falling losses; `lf parallel check` validates a context-parallel plan for it and refuses a pipeline
    plan by name (its spec declares none: the head is tied to the embedding)."""
    sets = ["model.recipe=gemma", "train.steps=3", "train.log_every=1", "train.lr=1e-2", "train.warmup_steps=1",
            "corpus.max_chars=20000", "corpus.seq_len=32", "train.global_batch=4", "parallel.micro_batch=4",
            "eval.at_end=false", "train.ckpt_every=3", "run.device=cpu", f"run.out_dir='{tmp_path / 'runs'}'",
            f"corpus.cache_dir='{tmp_path / 'corpus'}'"]
    out = CliRunner().invoke(app, ["run", str(ROOT / "examples" / "llama3_pretrain.toml"),
                                   *[a for s in sets for a in ("--set", s)]])
    assert out.exit_code == 0, out.output[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    losses = [json.loads(r)["train/loss"] for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    for plan, want in (("cp=2,cp_kind=ring,zero=3", 0), ("pp=2,grad_accum=2", 2)):
        out = CliRunner().invoke(app, ["parallel", "check", "--recipe", "gemma", "--plan", plan, "--nproc", "2",
                                       "--dry-run", "--cache-dir", str(tmp_path / "cache")])
        assert out.exit_code == want, out.output[-2000:]
    assert "got model.recipe = 'gemma'" in " ".join(out.output.split())
