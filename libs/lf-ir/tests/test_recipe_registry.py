"""The recipe registry (:mod:`lf_ir.recipes._spec`): every registered recipe's spec builds, and its lookups fail
with messages that name what was asked and what exists.

Oracles: each recipe's own graph (its parameter count, the mask kinds and tensor-parallel splits its nodes
declare) and the functions of :mod:`lf_ir.interop`; the messages are compared with the registered names.
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import torch

import lf_ir
from lf_ir import RECIPES, RecipeSpec, interop, param_count, recipe_names, recipe_spec, register_recipe
from lf_ir.recipes import _spec, llama3, vla


def _mask_kinds(graph) -> set[str]:
    """Mask kinds written in the graph's nodes (a string or a Mask's ``kind``), at any depth."""
    found, todo = set(), [msgspec.to_builtins(graph)]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            mask = item.get("mask")
            if mask is not None:
                found.add(mask if isinstance(mask, str) else mask["kind"])
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return found


def test_every_recipe_module_registers_itself():
    """The seven recipe modules each registered one spec, under the name their graph carries, reachable from the
    top package; RECIPES is that registry (read-only)."""
    assert recipe_names() == ("gemma", "llama3", "qwen2_vl", "vla", "vla_flow", "wan_dit", "wan_vae")
    assert set(RECIPES) == set(recipe_names()) and lf_ir.RECIPES is RECIPES
    assert RECIPES["llama3"] is llama3.SPEC is recipe_spec("llama3")
    with pytest.raises(TypeError):
        RECIPES["x"] = llama3.SPEC  # type: ignore[index]
    families = {name: spec.family for name, spec in RECIPES.items()}
    assert families == {"gemma": "llm", "llama3": "llm", "qwen2_vl": "vlm", "vla": "vla", "vla_flow": "vla_flow",
                        "wan_dit": "video", "wan_vae": "video_vae"}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_tiny_graph_and_model_build_on_meta(name):
    """Oracle: the recipe's own graph. The tiny model built on meta has the graph's parameter count; the mask
    kinds the graph's nodes declare are among the spec's ``masks``; the spec says tensor parallel exactly when
    some node of the graph has a tensor-parallel split."""
    spec = recipe_spec(name)
    cfg = spec.config(spec.tiny)
    assert isinstance(cfg, spec.config_class)
    graph = spec.build_graph(cfg)
    assert graph.recipe == name
    model = spec.build_model(cfg, graph)
    params = list(model.parameters())
    assert params and all(p.device.type == "meta" for p in params)
    assert sum(p.numel() for p in params) == param_count(graph)
    assert _mask_kinds(graph) <= set(spec.masks) and spec.masks
    splits = any(d is not None for c in graph.components for n in c.nodes for d in n.tp_dims().values())
    assert spec.tensor_parallel == splits


def test_facts_the_orchestrator_reads():
    """The parallelism facts lf run's plan checks read (before: lf-orchestrator's CP_RECIPES and its
    ``!= "llama3"`` pipeline test) and the converters `lf convert` offers (before: its CONVERTERS table)."""
    assert {n for n in RECIPES if RECIPES[n].context_parallel} == {"gemma", "llama3", "wan_dit"}
    assert {n for n in RECIPES if RECIPES[n].pipeline} == {"llama3", "vla"}
    assert RECIPES["llama3"].train_seq_len == 8192 and RECIPES["llama3"].takes_seq_len
    assert not RECIPES["vla"].takes_seq_len
    converters = {n: (s.import_hf, s.export_hf) for n, s in RECIPES.items() if s.import_hf or s.export_hf}
    from lf_ir.interop import hf_gemma

    assert {n: (i.resolve(), e.resolve()) for n, (i, e) in converters.items()} == {
        "gemma": (hf_gemma.import_hf_gemma, hf_gemma.export_hf_gemma),
        "llama3": (interop.import_hf_llama, interop.export_hf_llama),
        "qwen2_vl": (interop.import_hf_qwen2_vl, interop.export_hf_qwen2_vl),
        "wan_dit": (interop.import_diffusers_wan, interop.export_diffusers_wan),
        "wan_vae": (interop.import_diffusers_wan_vae, interop.export_diffusers_wan_vae)}


def test_sizes_match_in_any_case():
    """``8b`` is ``8B``: the spec, and the per-recipe factories that go through it, give the same config."""
    spec = recipe_spec("llama3")
    assert spec.size_name("8b") == "8B" and spec.size_name("TINY") == "tiny"
    assert spec.config("70b") == spec.config("70B") == llama3.llama3_config("70b")
    assert vla.vla_config("SMALL") == vla.vla_config("small")
    assert recipe_spec("wan_vae").config("WAN2.1") == recipe_spec("wan_vae").config("wan2.1")


def test_unknown_size_names_the_recipe_and_its_sizes():
    with pytest.raises(ValueError, match=r"^model\.size: unknown llama3 size '9b'; expected one of "
                                         r"\['1B', '70B', '8B', 'tiny'\] \(any case\)$"):
        recipe_spec("llama3").config("9b")
    with pytest.raises(ValueError, match=r"^--size: unknown vla size 'big'"):
        recipe_spec("vla").size_name("big", where="--size")


def test_unknown_recipe_lists_the_names_and_the_closest():
    with pytest.raises(ValueError) as err:
        recipe_spec("lama3", where="model.recipe")
    assert str(err.value) == ("model.recipe: unknown recipe 'lama3'; expected one of gemma, llama3, qwen2_vl, vla, "
                              "vla_flow, wan_dit, wan_vae; did you mean 'llama3'?")
    with pytest.raises(ValueError) as err:
        recipe_spec("gpt")
    assert str(err.value).endswith("expected one of gemma, llama3, qwen2_vl, vla, vla_flow, wan_dit, wan_vae")


def test_register_refuses_a_duplicate_and_adds_a_new_recipe(monkeypatch):
    """A second spec under a registered name is refused (the registry keeps the first); a new name is added
    and found by every lookup."""
    monkeypatch.setattr(_spec, "_REGISTRY", dict(_spec._REGISTRY))  # the test's recipe goes with it
    with pytest.raises(ValueError, match="a recipe named 'llama3' is registered already"):
        register_recipe(dataclasses.replace(llama3.SPEC, family="other"))
    assert recipe_spec("llama3") is llama3.SPEC
    mini = register_recipe(dataclasses.replace(llama3.SPEC, name="mini_llm", sizes={"tiny": {"layers": 1}}))
    assert recipe_spec("mini_llm") is mini and "mini_llm" in recipe_names()
    with torch.device("meta"):
        assert len(mini.build_model(mini.config("Tiny")).blocks) == 1
    with pytest.raises(TypeError, match="expected a RecipeSpec"):
        register_recipe(llama3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("change", "message"), [
    ({"sizes": {"8B": {}, "8b": {}, "tiny": {}}}, "sizes: '8B' and '8b' differ only in case"),
    ({"tiny": "small"}, "tiny: expected one of its sizes"),
    ({"masks": ("sliding",)}, "masks: expected kinds of"),
    ({"context_parallel": ("ring+ulysses",)}, "context_parallel: expected kinds of"),
    ({"name": "Llama 3"}, "name: expected a non-empty lower-case name"),
    ({"tensor_parallel": False}, "sequence_parallel needs tensor_parallel"),
])
def test_spec_refuses_inconsistent_fields(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(llama3.SPEC, **change)
    assert isinstance(llama3.SPEC, RecipeSpec)
