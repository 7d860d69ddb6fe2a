"""Config decoding and the one-line errors of `lf`. Oracle: the written config and the key
that was broken; the CLI is driven through Typer's runner and, once, as a real process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import ConfigError, load_config, to_toml

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

runner = CliRunner()


def _error_line(result) -> str:
    lines = [ln for ln in result.output.strip().splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    return lines[0]


def test_default_config_resolves_and_round_trips(tmp_path):
    cfg = load_config()
    assert cfg.data.tasks[0] == "reach-v3" and cfg.model.recipe == "vla"
    path = tmp_path / "resolved.toml"
    path.write_text(to_toml(cfg))
    assert load_config(path) == cfg


def test_misspelled_key_is_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nstepz = 3\n")
    line = _error_line(runner.invoke(app, ["run", str(bad)]))
    assert f"{bad}: unknown key 'train.stepz'" in line


def test_non_numeric_learning_rate_is_named():
    line = _error_line(runner.invoke(app, ["run", "--set", "train.lr=fast"]))
    assert "train.lr: expected float, got str" in line


def test_missing_dataset_path_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    line = _error_line(runner.invoke(app, ["run", "--set", "data.source=lerobot",
                                           "--set", f"data.path='{missing}'"]))
    assert f"data.path: no LeRobot dataset at '{missing}'" in line


def test_missing_config_file_and_bad_override_syntax(tmp_path):
    line = _error_line(runner.invoke(app, ["run", str(tmp_path / "x.toml")]))
    assert "config file not found" in line
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(overrides=["lr=3"])


def test_range_errors_name_key_and_value():
    with pytest.raises(ConfigError, match=r"train.global_batch: expected an integer >= 1, got 0"):
        load_config(overrides=["train.global_batch=0"])
    with pytest.raises(ConfigError, match=r"memory.precision: expected one of 'auto', 'bf16', .*, got 'fp8'"):
        load_config(overrides=["memory.precision='fp8'"])


def test_overrides_apply():
    cfg = load_config(overrides=["train.steps=7", "train.warmup_steps=2", "data.tasks=['push-v3']", "run.name=x"])
    assert (cfg.train.steps, cfg.data.tasks, cfg.run.name) == (7, ["push-v3"], "x")


def test_cli_process_reports_bad_key_in_one_line(tmp_path):
    """The installed entry point, as a user runs it."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[modle]\nsize = 'tiny'\n")
    proc = subprocess.run([sys.executable, "-m", "lf_orchestrator", "run", str(bad)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {bad}: unknown key 'modle'; did you mean 'model'?"]


def test_version_and_schema():
    out = runner.invoke(app, ["--version"])
    import lf_orchestrator

    assert out.exit_code == 0 and out.output.strip() == f"lf {lf_orchestrator.__version__}" == "lf 0.10.0"
    schema = runner.invoke(app, ["config", "schema"])
    assert schema.exit_code == 0 and '"TrainSection"' in schema.output


def test_early_checks_name_the_key():
    """Oracle: the key each bad value belongs to; all fail before any run folder exists."""
    cases = {"data.tasks=['reach-v33']": "data.tasks: unknown Meta-World task 'reach-v33'; did you mean",
             "model.size='huge'": "model.size: unknown vla size 'huge'; expected one of ['3B', 'small', 'tiny']",
             "model.overrides.bogus=3": "model.overrides: unknown field 'bogus'",
             "model.overrides={dim=1.5}": "model.overrides.dim: expected int, got 1.5",
             "model.overrides={mrope_section=[1, 2]}": "model.overrides: unknown field 'mrope_section'",
             "model.overrides={dim={a=1}}":
                 "model.overrides.dim: expected bool | int | float | str | array, got object",
             "run.seed=-1": "run.seed: expected a value >= 0, got -1",
             "train.warmup_steps=-1": "train.warmup_steps: expected an integer >= 0, got -1",
             "run.name=''": "run.name: expected a non-empty folder name",
             "eval.seed=0": "eval.seed: expected a seed other than data.seed"}
    for override, message in cases.items():
        with pytest.raises(ConfigError, match="with --set: " + re.escape(message)):
            load_config(overrides=[override])
    with pytest.raises(ConfigError, match=r"model: .*dim 30 is not divisible by heads 4"):
        load_config(overrides=["model.size='tiny'", "model.overrides.dim=30"])


def test_resume_rejects_overrides_the_checkpoint_fixes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(load_config()))
    line = _error_line(runner.invoke(app, ["run", "--resume", str(run), "--set", "model.size='small'"]))
    assert "--set model.size cannot change on resume" in line
    line = _error_line(runner.invoke(app, ["run", "--resume", str(run), "--tune", "predict"]))
    assert "--tune cannot be given with --resume" in line and "--set" not in line
    line = _error_line(runner.invoke(app, ["run", str(run / "config.toml"), "--resume", str(run)]))
    assert "either a CONFIG or --resume, not both" in line
    line = _error_line(runner.invoke(app, ["run", "--resume", str(run), "--set", "run.device='cpu'"]))
    assert "no complete checkpoint to resume from" in line


@pytest.mark.parametrize(("override", "message"), [
    ("memory.recompute='fast'", "memory.recompute: expected one of 'none', 'full', 'selective', 'every_k', 'auto', "
                                "got 'fast'"),
    ("memory.precision='bf32'", "memory.precision: expected one of 'auto', 'bf16', 'fp16', 'fp32', got 'bf32'"),
    ("run.device=3", "run.device: expected one of 'auto', 'cpu', 'cuda', got 3"),
    ("train.on_nonfinite='retry'", "train.on_nonfinite: expected one of 'stop', 'skip', 'rollback', got 'retry'"),
])
def test_enum_errors_list_accepted_values(override, message):
    """Oracle: the Literal values of the field in config.py; the message names the file and the dotted key."""
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert str(info.value) == f"<default metaworld_vla.toml> with --set: {message}"


def test_plan_spec_enum_errors_list_accepted_values(tmp_path):
    """Oracle: lf_parallel.Plan's Literal values (pp_schedule, cp_kind); the message names the file and the key."""
    examples = Path(__file__).resolve().parents[3] / "examples"
    path = tmp_path / "llama.toml"
    path.write_text((examples / "llama3_pretrain.toml").read_text())
    with pytest.raises(ConfigError) as info:
        load_config(path, ["parallel.plan='manual'", "parallel.spec='pp=2,pp_schedule=fast'"])
    assert str(info.value) == (f"{path} with --set: parallel.spec: plan 'pp=2,pp_schedule=fast': pp_schedule: "
                               "expected one of 'gpipe', '1f1b', 'interleaved_1f1b', 'zero_bubble', got 'fast'")
    with pytest.raises(ConfigError, match=r"cp_kind: expected one of 'ring', 'ulysses', 'ring\+ulysses', got 'x'"):
        load_config(path, ["parallel.plan='manual'", "parallel.spec='cp_kind=x'"])


def test_config_schema_carries_field_docstrings():
    """Oracle: the attribute docstrings written under the fields in config.py / families/sections.py; every field
    of every section gets one, verbatim (dedented)."""
    import json

    result = CliRunner().invoke(app, ["config", "schema"])
    assert result.exit_code == 0, result.output
    defs = json.loads(result.output)["$defs"]
    recompute = defs["MemorySection"]["properties"]["recompute"]
    assert recompute["description"].startswith(
        "Activation recomputation of transformer blocks (lf-memory ``apply_recompute``); ``auto``: the\nknapsack")
    assert defs["TrainSection"]["properties"]["log_every"]["description"] == "Steps between scalar logs."
    assert defs["CorpusSection"]["properties"]["min_chars"]["description"] == "Skip docstrings shorter than this."
    missing = [f"{name}.{field}" for name, d in defs.items() if name != "Config"
               for field, prop in d["properties"].items() if not prop.get("description")]
    assert missing == []


def test_a_set_value_that_is_not_valid_toml_says_so():
    """An unclosed table or array in --set is named as invalid TOML (it was read as a string and then refused as
    'expected object, got str'); a bare word is still a string."""
    for raw in ("{vocab_size=1024", "[1, 2", "'open"):
        with pytest.raises(ConfigError, match=re.escape(f"--set model.overrides={raw}: not a valid TOML value")):
            load_config(overrides=[f"model.overrides={raw}"])
    assert load_config(overrides=["run.name=plain"]).run.name == "plain"
    assert load_config(overrides=["parallel.spec="]).parallel.spec == ""  # an empty value stays the empty string


def test_model_overrides_take_each_recipe_fields_type():
    """Floats, bools and arrays reach the recipe config converted to its field types (an array becomes the tuple
    mrope_section holds); a value of another type is refused naming model.overrides.<field> and the value."""
    from lf_orchestrator.families.recipes import recipe_config

    llm = EXAMPLES / "llama3_pretrain.toml"
    cfg = load_config(llm, ["model.overrides={vocab_size=512, norm_eps=1e-5, tie_embeddings=true}"])
    rcfg, _ = recipe_config(cfg.model.recipe, cfg.model.size, cfg.model.overrides)
    assert (rcfg.norm_eps, rcfg.tie_embeddings, rcfg.vocab_size) == (1e-5, True, 512)
    vlm = load_config(EXAMPLES / "qwen2_vl_sft.toml", ["model.overrides.mrope_section=[4, 2, 2]",
                                                       "model.overrides.dim=64", "model.overrides.heads=4"])
    rcfg, _ = recipe_config(vlm.model.recipe, vlm.model.size, vlm.model.overrides)
    assert rcfg.mrope_section == (4, 2, 2)
    cases = {"model.overrides.norm_eps='x'": "model.overrides.norm_eps: expected float, got 'x'",
             "model.overrides.tie_embeddings=1": "model.overrides.tie_embeddings: expected bool, got 1",
             "model.overrides.dim=true": "model.overrides.dim: expected int, got True"}
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(llm, [override])
