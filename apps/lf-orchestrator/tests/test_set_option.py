"""``--set`` on every command that reads a run config (issue 25: `lf plan CONFIG` had none though `lf run` has).
Oracles: the values --set gives, read back from the commands' JSON output (tokens per sample, global batch, the
plan), the same config loaded with load_config, and the one shared option definition (``_options.SetOpt``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from lf_orchestrator.cli import app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
LLM = str(EXAMPLES / "llama3_pretrain.toml")
runner = CliRunner()


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_every_config_command_takes_the_same_set_option():
    """Oracle: ``_options.SetOpt``'s help; run, launch, plan, memory and config show declare --set through it (the
    same help text and metavar), not copies; so do eval and sample (their keys: test_eval_sample_set.py)."""
    from lf_orchestrator._options import SetOpt

    help_text = SetOpt.__metadata__[0].help
    command = typer.main.get_command(app)
    paths = [["run"], ["launch"], ["plan"], ["memory"], ["config", "show"], ["eval"], ["sample"]]
    for path in paths:
        cmd = command
        for name in path:
            cmd = cmd.commands[name]
        (opt,) = [p for p in cmd.params if "--set" in getattr(p, "opts", ())]
        assert (opt.help, opt.metavar, opt.multiple) == (help_text, "SECTION.KEY=VALUE", True), path


def test_plan_and_memory_apply_set_like_run():
    """`lf plan CONFIG --set`: the sample and batch follow the overrides (corpus.seq_len 256, global batch 32);
    `lf memory CONFIG --set` estimates the overridden manual plan; a misspelled key is refused with the closest."""
    out = _json(["plan", LLM, "--gpus", "2", "--top", "1", "--json",
                 "--set", "corpus.seq_len=256", "--set", "train.global_batch=32"])
    assert (out["tokens_per_sample"], out["global_batch"]) == (256, 32)
    plain = _json(["plan", LLM, "--gpus", "2", "--top", "1", "--json"])
    assert (plain["tokens_per_sample"], plain["global_batch"]) != (256, 32)
    mem = _json(["memory", LLM, "--gpus", "2", "--json", "--set", "parallel.plan='manual'",
                 "--set", "parallel.spec='dp=2,zero=3'", "--set", "corpus.seq_len=256"])
    assert mem["plan"].startswith("dp=2 zero_stage=3 ")
    bad = runner.invoke(app, ["memory", LLM, "--set", "parallel.micro_batc=2"])
    assert bad.exit_code == 2
    assert "unknown key 'parallel.micro_batc'; did you mean 'parallel.micro_batch'?" in bad.output
    refused = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "1B", "--set", "train.steps=2"])
    assert refused.exit_code == 2 and "--set changes a run CONFIG's values" in refused.output


def test_plan_without_config_plans_the_default_with_the_overrides():
    """Like `lf run --set ...`, `lf plan --set ...` without CONFIG reads the embedded default (the Meta-World VLA,
    whose prefix-LM blocks the host-launch model could not count before); oracle: load_config(None, overrides)."""
    from lf_orchestrator.config import load_config

    out = _json(["plan", "--gpus", "1", "--top", "1", "--json", "--set", "train.global_batch=32"])
    cfg = load_config(None, ["train.global_batch=32"])
    assert (out["global_batch"], out["model"]) == (cfg.train.global_batch, cfg.model.recipe)
