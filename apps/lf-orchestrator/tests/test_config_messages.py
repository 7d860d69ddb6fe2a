"""What config errors and `lf config schema` tell the user (LoongForge issue 25): enum errors list the accepted
values, unknown keys get the closest valid key, every field has a description. Oracles: the msgspec structs
themselves (their fields, Literal values and attribute docstrings) and difflib's closest match."""

from __future__ import annotations

import json
import re
import typing

import msgspec
import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import Config, ConfigError, check_resume_overrides, load_config

runner = CliRunner()
DEFAULT = "<default metaworld_vla.toml> with --set"


def _sections() -> list[tuple[str, type]]:
    return [(f.name, f.type) for f in msgspec.structs.fields(Config)]


def test_schema_describes_every_field_of_every_section():
    """Oracle: the struct fields of Config and of each section (iterated here, not listed by hand): each has a
    non-empty description in `lf config schema`'s JSON, and each section property of Config too."""
    result = runner.invoke(app, ["config", "schema"])
    assert result.exit_code == 0, result.output
    defs = json.loads(result.output)["$defs"]
    missing = [f"{name}: the section" for name, _ in _sections()
               if not defs["Config"]["properties"][name].get("description")]
    for name, section in _sections():
        props = defs[section.__name__]["properties"]
        missing += [f"{name}.{f.name}" for f in msgspec.structs.fields(section)
                    if not props.get(f.encode_name, {}).get("description", "").strip()]
    assert missing == []
    assert defs["Config"]["properties"]["train"]["description"].startswith("``[train]``: optimizer")


def test_schema_keys_lists_every_key_with_type_default_and_description():
    """Oracle: the struct fields and their defaults; ``lf config schema --keys`` prints one entry per dotted key
    with its type (an enum's values), its default and its description, indented under it."""
    result = runner.invoke(app, ["config", "schema", "--keys"])
    assert result.exit_code == 0, result.output
    heads = [ln for ln in result.output.splitlines() if not ln.startswith("    ")]
    assert [h.split(":")[0] for h in heads] == [f"{name}.{f.name}" for name, s in _sections()
                                               for f in msgspec.structs.fields(s)]
    assert "memory.recompute: 'none' | 'full' | 'selective' | 'every_k' | 'auto' = \"none\"" in heads
    assert "train.steps: int = 1500\n    Optimizer steps.\n" in result.output
    bodies = result.output.split("\n" + heads[1])[0].splitlines()  # run.name and its description
    assert bodies[1].startswith("    Run name;")


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.recipe='x'"], "model.recipe: unknown recipe 'x'; expected one of gemma, llama3, qwen2_vl, vla, vla_flow, "
                           "wan_dit, wan_vae"),
    (["model.recipe='lama3'"], "model.recipe: unknown recipe 'lama3'; expected one of gemma, llama3, qwen2_vl, vla, "
                               "vla_flow, wan_dit, wan_vae; did you mean 'llama3'?"),
    (["model.overrides.mlp_activation='relu'"],
     "model.overrides.mlp_activation: expected one of 'gelu', 'swiglu', got 'relu'"),
])
def test_enum_errors_name_key_value_and_choices(overrides, message):
    """Oracle: the Literal values of the field (config.py; the vla recipe's VLAConfig.mlp_activation, reached
    through model.overrides, said 'invalid enum value' without the choices)."""
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    assert str(info.value) == f"{DEFAULT}: {message}"


def test_plan_string_enum_errors_list_choices_everywhere():
    """Oracle: lf_parallel.Plan's Literal values. ``lf memory --plan`` parses the string without a config; msgspec's
    'Invalid enum value' reached the user without the accepted values."""
    from lf_parallel import PlanError, PPSchedule, parse_plan

    with pytest.raises(PlanError) as info:
        parse_plan("pp=2,schedule=fast")
    choices = ", ".join(map(repr, typing.get_args(PPSchedule)))
    assert str(info.value) == f"plan 'pp=2,schedule=fast': pp_schedule: expected one of {choices}, got 'fast'"
    result = runner.invoke(app, ["memory", "--recipe", "llama3", "--size", "1B", "--plan", "cp=2,cp_kind=x"])
    assert result.exit_code == 2
    assert "cp_kind: expected one of 'ring', 'ulysses', 'ring+ulysses', got 'x'" in result.output
    result = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "1B", "--gpus", "1", "--precision", "bf32"])
    flat = " ".join(result.output.replace("│", " ").split())  # typer's error box wraps the line
    assert result.exit_code == 2 and "'bf32' is not one of 'bf16', 'fp16', 'fp32'" in flat


def test_unknown_keys_suggest_the_closest_valid_key(tmp_path):
    """Oracle: difflib.get_close_matches over the section's fields (the sections at the top level); in a file,
    in --set and in --resume's --set; a key close to nothing lists the valid ones."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nwarmup_step = 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(info.value) == f"{bad}: unknown key 'train.warmup_step'; did you mean 'train.warmup_steps'?"
    bad.write_text("[modle]\nsize = 'tiny'\n")
    with pytest.raises(ConfigError, match=re.escape("unknown key 'modle'; did you mean 'model'?")):
        load_config(bad)
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["memory.recomput='full'"])
    assert str(info.value) == f"{DEFAULT}: unknown key 'memory.recomput'; did you mean 'memory.recompute'?"
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["eval.zzz=1"])
    assert str(info.value) == (f"{DEFAULT}: unknown key 'eval.zzz'; expected one of 'at_end', 'episodes', "
                               "'max_steps', 'random_baseline', 'seed'")
    with pytest.raises(ConfigError, match=re.escape("model.overrides: unknown field 'dimm' for recipe 'vla'; "
                                                    "did you mean 'dim'?")):
        load_config(overrides=["model.overrides.dimm=64"])
    with pytest.raises(ConfigError) as info:
        check_resume_overrides(["train.step=20"])
    assert str(info.value) == "--resume: --set train.step: unknown key 'train.step'; did you mean 'train.steps'?"
    result = runner.invoke(app, ["config", "show", "--set", "trian.steps=3"])
    assert result.exit_code == 2 and "unknown key 'trian'; did you mean 'train'?" in result.output
