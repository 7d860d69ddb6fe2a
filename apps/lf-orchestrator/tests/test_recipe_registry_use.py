"""The orchestrator reads what a recipe is from lf-ir's registry (``lf_ir.recipe_spec``), not from tables of its
own: ``model.recipe`` is checked against it, ``model.size`` is matched in any case, `lf config schema`,
`lf ir show`, `lf plan` and `lf convert` list its recipes, and the trainer's context-parallel and pipeline refusals
read its parallelism facts.

Oracles: the registry itself (``lf_ir.recipe_names()``, the specs' fields), a recipe registered only for the test
(the registry is patched, nothing else), and the config of the registered spelling of a size.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_ir import param_count, recipe_names, recipe_spec, register_recipe, unregister_recipe
from lf_ir.recipes import llama3
from lf_orchestrator.cli import app
from lf_orchestrator.config import ConfigError, load_config

runner = CliRunner()
LLAMA = Path(__file__).resolve().parents[3] / "examples" / "llama3_pretrain.toml"


@pytest.fixture
def mini():
    """A dense LLM registered for the test only: llama3's spec under another name with one tiny size."""
    yield register_recipe(dataclasses.replace(llama3.SPEC, name="mini_llm", sizes={"tiny": {"layers": 1}},
                                                    context_parallel=(), pipeline=False))
    unregister_recipe("mini_llm")


def test_model_size_is_matched_in_any_case():
    """``model.size = "tiny"`` in upper case loads, and the recipe config is the registered size's."""
    from lf_orchestrator.families.recipes import recipe_config

    cfg = load_config(LLAMA, ["model.size='TINY'", "corpus.seq_len=64"])
    rcfg, graph = recipe_config(cfg.model.recipe, cfg.model.size, cfg.model.overrides)
    assert rcfg == llama3.llama3_config("tiny", **cfg.model.overrides) and graph.recipe == "llama3"


def test_model_recipe_is_checked_against_the_registry(mini):
    """A registered recipe of a family lf run trains loads with no other edit (before: a Literal in config.py and a
    family table had to be edited); one of a family lf run has no trainer for is refused by name; an unknown one
    lists the registered recipes."""
    cfg = load_config(LLAMA, ["model.recipe='mini_llm'", "model.size='tiny'"])
    from lf_orchestrator.families import family_module

    assert family_module(cfg.model.recipe).__name__ == "lf_orchestrator.families.llm"
    register_recipe(dataclasses.replace(llama3.SPEC, name="mini_rl", family="rl"))
    try:
        with pytest.raises(ConfigError, match=r"model\.recipe: 'mini_rl' \(family 'rl'\) is registered in lf-ir but "
                                              r"lf run trains the families \["):
            load_config(LLAMA, ["model.recipe='mini_rl'", "model.size='tiny'"])
    finally:
        unregister_recipe("mini_rl")
    with pytest.raises(ConfigError, match=r"model\.recipe: unknown recipe 'mini_lm'; expected one of gemma, llama3, "
                                          r"mini_llm, .*; did you mean 'mini_llm'\?"):
        load_config(LLAMA, ["model.recipe='mini_lm'"])


def test_schema_lists_the_registered_recipes(mini):
    """`lf config schema` (JSON and --keys) gives model.recipe's values from the registry, the test's recipe
    included."""
    schema = json.loads(runner.invoke(app, ["config", "schema"]).output)
    assert schema["$defs"]["ModelSection"]["properties"]["recipe"]["enum"] == list(recipe_names())
    assert "mini_llm" in recipe_names()
    keys = runner.invoke(app, ["config", "schema", "--keys"]).output
    assert "model.recipe: " + " | ".join(map(repr, recipe_names())) + ' = "vla"' in keys


def test_ir_show_and_plan_take_any_registered_recipe_and_size_case(mini):
    """`lf ir show` builds the test's recipe from its spec alone; sizes in any case; `lf plan` sizes a llama3 8b
    model like 8B."""
    out = runner.invoke(app, ["ir", "show", "--recipe", "mini_llm", "--size", "TINY", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    assert d["size"] == "tiny" and d["params"] == param_count(mini.build_graph(mini.config("tiny"), seq_len=8192))
    bad = runner.invoke(app, ["ir", "show", "--recipe", "mini_lm", "--size", "tiny"])
    assert bad.exit_code == 2 and "did you mean 'mini_llm'?" in bad.output
    from lf_orchestrator.plan_cmd import resolve_model

    small, _, _ = resolve_model(None, "llama3", "1b", 64)
    big, _, _ = resolve_model(None, "llama3", "1B", 64)
    assert small == big


def test_convert_offers_the_recipes_with_converters(mini, tmp_path):
    """`lf convert` takes the recipes whose spec has HF / diffusers converters (before: its CONVERTERS table)."""
    from lf_orchestrator.convert_cmd import converters

    with_converters = sorted(n for n in recipe_names() if recipe_spec(n).import_hf)
    assert list(converters()) == with_converters and "mini_llm" in with_converters and "vla" not in converters()
    r = runner.invoke(app, ["convert", "import-hf", str(tmp_path), str(tmp_path / "o"), "--recipe", "vla"])
    assert r.exit_code == 2 and f"--recipe: no converter for 'vla'; available: {with_converters}" in r.output


def test_context_and_pipeline_refusals_read_the_spec(mini):
    """cp and pp are refused for a recipe whose spec does not declare them, naming the recipes that do; llama3
    (which declares both) passes the recipe test."""
    from types import SimpleNamespace

    from lf_orchestrator.families._context import cp_unsupported
    from lf_orchestrator.families._plan import _pipeline_unsupported
    from lf_parallel import parse_plan

    cp = parse_plan("cp=2,cp_kind=ring")
    assert cp_unsupported(cp, "llama3") is None
    assert "model.recipe in ['gemma', 'llama3', 'wan_dit'] only" in cp_unsupported(cp, "mini_llm")
    register_recipe(dataclasses.replace(llama3.SPEC, name="mini_notp", tensor_parallel=False,
                                        sequence_parallel=False))
    try:
        from lf_orchestrator.families._plan import _supported

        assert "RecipeSpec.tensor_parallel is not set" in _supported(parse_plan("tp=2"), False, "mini_notp")
        assert _supported(parse_plan("tp=2"), False, "llama3") is None
    finally:
        unregister_recipe("mini_notp")
    pp = parse_plan("pp=2")
    cfg = SimpleNamespace(model=SimpleNamespace(recipe="mini_llm"))
    assert "model.recipe in ['llama3', 'vla'] only" in _pipeline_unsupported(pp, cfg, None)


@pytest.mark.parametrize("recipe", sorted(n for n in recipe_names() if recipe_spec(n).import_hf))
def test_convert_round_trip_through_the_spec(tmp_path, recipe):
    """lf tiny model -> `lf convert export-hf` -> `lf convert import-hf`: the weights come back bit for bit under
    the same names, the model built and converted through the recipe's spec alone (needs neither transformers
    nor diffusers). Oracle: the original state dict."""
    import msgspec
    import torch
    from safetensors.torch import load_file, save_file

    from lf_ir import materialize

    spec = recipe_spec(recipe)
    cfg = spec.config(spec.tiny)
    state = {k: v.contiguous() for k, v in materialize(spec.build_model(cfg), "cpu", seed=1).state_dict().items()}
    (tmp_path / "lf").mkdir()
    save_file(state, str(tmp_path / "lf" / "model.safetensors"))
    (tmp_path / "lf" / "model.json").write_text(json.dumps({"recipe": recipe, "config": msgspec.to_builtins(cfg)}))
    r = runner.invoke(app, ["convert", "export-hf", str(tmp_path / "lf"), str(tmp_path / "peer")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["convert", "import-hf", str(tmp_path / "peer"), str(tmp_path / "back"), "--recipe", recipe])
    assert r.exit_code == 0, r.output
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(back) == sorted(state) and all(torch.equal(back[k], state[k]) for k in state)
