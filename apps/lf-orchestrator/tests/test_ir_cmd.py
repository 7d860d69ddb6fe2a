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
    assert r.exit_code == 2 and "not an HF model folder (no config.json)" in r.output
    r = runner.invoke(app, ["convert", "export-hf", str(tmp_path), str(tmp_path / "out")])
    assert r.exit_code == 2 and "not an lf model folder" in r.output
    r = runner.invoke(app, ["convert", "import-hf", str(tmp_path), str(tmp_path / "o"), "--recipe", "vla"])
    assert r.exit_code == 2 and "no HF converter for 'vla'" in r.output
