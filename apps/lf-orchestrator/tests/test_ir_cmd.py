"""`lf ir show` and `lf convert`. Oracles: the published Llama-3 parameter counts, the PaLM
FLOPs-per-token formula, and the HF model's own outputs after a round trip."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from lf_orchestrator.cli import app

runner = CliRunner()


def test_ir_show_llama3_8b_counts():
    out = runner.invoke(app, ["ir", "show", "--recipe", "llama3", "--size", "8B", "--seq", "8192", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    assert d["params"] == 8_030_261_248
    # PaLM / BENCH.md convention: 6 (N - N_embedding) + 12 L d S per token. The IR counts
    # matmul FLOPs only, so the 65 RMSNorm weight vectors (6 * 65 * 4096) are the exact gap.
    expected = 6 * (8_030_261_248 - 128_256 * 4096) + 12 * 32 * 4096 * 8192
    assert d["train_flops_per_token"] == expected - 6 * 65 * 4096
    assert d["graph"]["recipe"] == "llama3"


def test_ir_show_table_and_errors():
    out = runner.invoke(app, ["ir", "show", "--recipe", "vla", "--size", "small"])
    assert out.exit_code == 0 and "backbone" in out.output and "vision" in out.output
    bad = runner.invoke(app, ["ir", "show", "--recipe", "gpt", "--size", "x"])
    assert bad.exit_code == 2 and "unknown recipe 'gpt'" in bad.output
    bad = runner.invoke(app, ["ir", "show", "--recipe", "llama3", "--size", "9B"])
    assert bad.exit_code == 2 and "unknown llama3 size '9B'" in bad.output


@pytest.mark.parametrize("command", [["ir", "show"], ["plan", "--gpus", "8"], ["memory", "--gpus", "8"]])
def test_recipe_without_size_names_the_sizes(command):
    """`--recipe llama3` without `--size` exits 2 naming the recipe's sizes (was Typer's "Missing option '--size'"
    for `lf ir show`, and a generic hint for `lf plan` / `lf memory`). Oracle: lf_ir's llama3.SIZES."""
    from lf_ir.recipes import llama3

    out = runner.invoke(app, [*command, "--recipe", "llama3"])
    text = " ".join(out.output.split())
    assert out.exit_code == 2, text
    assert f"--size: missing; the llama3 recipe's sizes are {sorted(llama3.SIZES)}" in text, text
    assert "Missing option" not in text


def test_convert_round_trip_through_hf(tmp_path):
    """HF tiny Llama -> lf folder -> HF folder: the re-exported model gives the original logits."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    r = runner.invoke(app, ["convert", "import-hf", str(tmp_path / "hf"), str(tmp_path / "lf")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "lf" / "model.json").read_text())["recipe"] == "llama3"
    r = runner.invoke(app, ["convert", "export-hf", str(tmp_path / "lf"), str(tmp_path / "hf2")])
    assert r.exit_code == 0, r.output
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf2").eval()
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, back(ids).logits)


def test_convert_errors_name_the_folder(tmp_path):
    r = runner.invoke(app, ["convert", "import-hf", str(tmp_path), str(tmp_path / "out")])
    assert r.exit_code == 2 and "not a Hugging Face model folder (no config.json)" in r.output
    r = runner.invoke(app, ["convert", "export-hf", str(tmp_path), str(tmp_path / "out")])
    assert r.exit_code == 2 and "not an lf model folder" in r.output
    r = runner.invoke(app, ["convert", "import-hf", str(tmp_path), str(tmp_path / "o"), "--recipe", "vla"])
    assert r.exit_code == 2 and "--recipe: no converter for 'vla'" in r.output


def test_ir_show_json_totals_components_and_batch():
    """Oracle: the IR's own graph functions and graph_cost on the same graph."""
    from lf_ir import backward_flops, forward_flops, graph_cost
    from lf_ir.recipes.llama3 import build_graph, llama3_config

    out = runner.invoke(app, ["ir", "show", "--recipe", "llama3", "--size", "tiny", "--seq", "32",
                              "--batch", "4", "--dtype-bytes", "4", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    g = build_graph(llama3_config("tiny"), seq_len=32)
    fwd, bwd = forward_flops(g, 1), backward_flops(g, 1)
    assert d["forward_flops_per_sample"] == fwd and d["train_flops_per_sample"] == fwd + bwd
    assert d["forward_flops_per_token"] == fwd / 32 and d["train_flops_per_token"] == (fwd + bwd) / 32
    assert d["main_component"] == "text" and d["tokens_per_sample"] == 32
    comp = graph_cost(g, batch=4, dtype_bytes=4).components[0]
    assert d["components"][0]["saved_bytes"] == comp.saved_bytes == d["saved_bytes_per_batch"]
    assert d["forward_flops_unmasked_per_sample"] < fwd  # causal keeps (s + 1) / 2s of the scores


def test_ir_show_picks_up_any_registered_recipe():
    """A recipe registered in lf-ir's registry (``lf_ir.register_recipe``) appears without editing the command."""
    import dataclasses

    from lf_ir import register_recipe, unregister_recipe
    from lf_ir.recipes import vla as vla_recipe

    register_recipe(dataclasses.replace(vla_recipe.SPEC, name="mini", sizes={"any": vla_recipe.SIZES["tiny"]},
                                              tiny="any"))
    try:
        out = runner.invoke(app, ["ir", "show", "--recipe", "mini", "--size", "any"])
        assert out.exit_code == 0, out.output
        assert "'backbone'" in out.output and "FLOPs per token" in out.output and "saved MiB" in out.output
        bad = runner.invoke(app, ["ir", "show", "--recipe", "mini", "--size", "any", "--seq", "8"])
        assert bad.exit_code == 2 and "the mini recipe's sequence length follows from its config" in bad.output
        bad = runner.invoke(app, ["ir", "show", "--recipe", "nope", "--size", "x"])
        assert bad.exit_code == 2 and "mini" in bad.output and "llama3" in bad.output
    finally:
        unregister_recipe("mini")


def test_ir_show_every_recipe_tiny_runs():
    """Every registered recipe prints the table of its tiny size (the generic path, new recipes included)."""
    from lf_ir.recipes import RECIPES

    for name, spec in RECIPES.items():
        out = runner.invoke(app, ["ir", "show", "--recipe", name, "--size", spec.tiny, "--json"])
        assert out.exit_code == 0, (name, out.output)
        d = json.loads(out.output)
        assert d["params"] == sum(c["params"] for c in d["components"]) and d["train_flops_per_sample"] > 0


@pytest.mark.parametrize("recipe", ["qwen2_vl", "wan_dit", "wan_vae"])
def test_convert_round_trip_for_every_peer_recipe(tmp_path, recipe):
    """lf tiny model -> export-hf (transformers / diffusers folder) -> import-hf: the weights come back
    bit for bit under the same names. Oracle: the original state dict (peer-side parity of these
    converters is tested in lf-ir against transformers and diffusers)."""
    import importlib

    import msgspec
    from safetensors.torch import load_file, save_file

    from lf_ir import materialize

    pytest.importorskip("transformers" if recipe == "qwen2_vl" else "diffusers")
    module = importlib.import_module(f"lf_ir.recipes.{recipe}")
    cfg = getattr(module, f"{recipe}_config")("tiny")
    cls = getattr(module, {"qwen2_vl": "Qwen2VLModel", "wan_dit": "WanDiTModel", "wan_vae": "WanVAE"}[recipe])
    with torch.device("meta"):
        model = cls(cfg)
    materialize(model, "cpu", seed=1)
    src = tmp_path / "lf"
    src.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(src / "model.safetensors"))
    (src / "model.json").write_text(json.dumps({"recipe": recipe, "config": msgspec.to_builtins(cfg)}))
    r = runner.invoke(app, ["convert", "export-hf", str(src), str(tmp_path / "peer")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "peer" / "config.json").is_file()
    r = runner.invoke(app, ["convert", "import-hf", str(tmp_path / "peer"), str(tmp_path / "back"), "--recipe", recipe])
    assert r.exit_code == 0, r.output
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
    assert json.loads((tmp_path / "back" / "model.json").read_text())["recipe"] == recipe


def test_ir_show_llama3_defaults_to_typical_training_length():
    """Oracle: the explicit `--seq 8192` run (same numbers) and the PaLM formula at S = 8192, not the model's
    131072 maximum; the text output says where the default comes from."""
    default = runner.invoke(app, ["ir", "show", "--recipe", "llama3", "--size", "8B", "--json"])
    explicit = runner.invoke(app, ["ir", "show", "--recipe", "llama3", "--size", "8B", "--seq", "8192", "--json"])
    assert default.exit_code == 0 and explicit.exit_code == 0, default.output
    d, e = json.loads(default.output), json.loads(explicit.output)
    assert d["tokens_per_sample"] == 8192 and d["train_flops_per_token"] == e["train_flops_per_token"]
    assert d["tokens_per_sample_from"] == "llama3's typical training length; the model allows up to 131,072"
    assert e["tokens_per_sample_from"] == "--seq"
    text = runner.invoke(app, ["ir", "show", "--recipe", "llama3", "--size", "8B"]).output
    assert "8,192 tokens per sample" in text and "the default: llama3's typical training length" in text
    tiny = json.loads(runner.invoke(app, ["ir", "show", "--recipe", "llama3", "--size", "tiny", "--json"]).output)
    assert tiny["tokens_per_sample"] == 256  # capped at the tiny model's max_seq_len
