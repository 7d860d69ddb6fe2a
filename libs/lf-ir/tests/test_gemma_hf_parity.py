"""gemma recipe against HF transformers' GemmaForCausalLM (the oracle), float32 on the CPU.

Weights are random (not HF's init: the zero-initialized norm weights and every matrix perturbed so that
every parameter matters), saved by HF with ``save_pretrained`` (safetensors) and imported by lf; exported
back and re-loaded by HF. Tolerances: 1e-5 relative to the largest logit and, for gradients, to each
tensor's largest entry (float32; both run the same ops in the same order, the attention kernels aside:
HF's SDPA and lf-kernels' may round differently). The embedding scale and the ``1 + w`` norm are also
checked bit for bit in bfloat16, where HF's rounding order (scale rounded to bf16, the norm's product in
float32 before the cast) shows. Skipped without ``transformers`` (the ``test`` extra of lf-ir)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lf_ir import param_count  # noqa: E402
from lf_ir.interop.hf_gemma import (  # noqa: E402
    export_hf_gemma,
    gemma_config_from_hf,
    hf_config_from_gemma,
    hf_to_lf_state,
    import_hf_gemma,
    lf_to_hf_state,
    load_hf_gemma,
)
from lf_ir.recipes.gemma import GemmaModel, build_graph, gemma_config, next_token_loss  # noqa: E402

VOCAB = 300
CASES = {
    # name: (hidden, heads, kv_heads, head_dim)
    "mqa": (64, 4, 1, 16),
    "gqa-heads-wider-than-dim": (48, 4, 2, 16),
}


def _hf_config(hidden, heads, kv_heads, head_dim):
    return transformers.GemmaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=56, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=128, rms_norm_eps=1e-6,
        pad_token_id=None)  # HF's pad row gets no embedding gradient; lf's embedding has no pad row


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(HF model, lf model imported from HF's save_pretrained folder, token ids)."""
    torch.manual_seed(0)
    hf = transformers.GemmaForCausalLM(_hf_config(*CASES[request.param])).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    src = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(src, safe_serialization=True)
    lf = load_hf_gemma(src).eval()
    ids = torch.randint(0, VOCAB, (2, 40), generator=g)
    return hf, lf, ids


def _close(actual, expected, rel):
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * float(expected.abs().max()))


def test_imported_weights_give_hf_logits(pair):
    hf, lf, ids = pair
    assert isinstance(lf, GemmaModel) and len(lf.blocks) == 2
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        actual = lf(ids)
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    _close(actual, expected, 1e-5)
    positions = torch.arange(ids.shape[1]).expand_as(ids) + torch.tensor([[3], [70]])
    with torch.no_grad():
        _close(lf(ids, positions=positions), hf(input_ids=ids, position_ids=positions).logits, 1e-5)


def test_same_loss_and_every_gradient(pair):
    hf, lf, ids = pair
    hf.zero_grad()
    lf.zero_grad()
    hf_loss = hf(input_ids=ids, labels=ids).loss
    lf_loss = next_token_loss(lf(ids), ids)
    torch.testing.assert_close(lf_loss, hf_loss, rtol=1e-5, atol=0)
    hf_loss.backward()
    lf_loss.backward()
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}  # the tied lm_head is not listed apart
    lf_grads = lf_to_hf_state({n: p.grad for n, p in lf.named_parameters()}, lf.cfg)
    assert set(lf_grads) == set(hf_grads)
    for name, grad in hf_grads.items():
        assert grad is not None and float(grad.abs().max()) > 0, name
        _close(lf_grads[name], grad, 1e-5)


def test_export_loads_in_hf_with_identical_outputs(pair, tmp_path):
    hf, lf, ids = pair
    export_hf_gemma(lf, tmp_path)
    back = transformers.GemmaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert gemma_config_from_hf(back.config.to_dict()) == lf.cfg
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, hf(input_ids=ids).logits)
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_bf16_embedding_scale_and_norm_are_hf_bit_for_bit(pair):
    """Oracle: HF's own embedding and GemmaRMSNorm modules of the same weights, in bfloat16."""
    hf, lf, ids = pair
    hf_b, lf_b = hf.model, lf.components["text"]
    emb = lf_b["embed"].to(torch.bfloat16)
    hf_emb = hf_b.embed_tokens.to(torch.bfloat16)
    try:
        assert torch.equal(emb(ids), hf_emb(ids))
        x = torch.randn(2, 9, lf.cfg.dim, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
        norm, hf_norm = lf_b["norm"].to(torch.bfloat16), hf_b.norm.to(torch.bfloat16)
        out = norm(x)
        assert out.dtype == torch.bfloat16 and torch.equal(out, hf_norm(x))
    finally:
        lf.float()
        hf.float()


def _hf_fields(cfg):
    """GemmaConfig keyword arguments from our config.json dict (less the keys only files carry)."""
    return {k: v for k, v in hf_config_from_gemma(cfg).items()
            if k not in ("model_type", "torch_dtype", "dtype", "hidden_activation")}


@pytest.mark.parametrize(("size", "expected"), [("2B", 2_506_172_416), ("7B", 8_537_680_896)])
def test_full_size_counts_match_hf_on_meta(size, expected):
    """Oracle: GemmaForCausalLM built on the meta device from the equivalent GemmaConfig."""
    cfg = gemma_config(size)
    with torch.device("meta"):
        hf = transformers.GemmaForCausalLM(transformers.GemmaConfig(**_hf_fields(cfg)))
    assert sum(p.numel() for p in hf.parameters()) == param_count(build_graph(cfg)) == expected


def test_hf_config_round_trip_and_refusals():
    """Oracle: GemmaConfig's own serialization of our exported config; its defaults are gemma-7b."""
    for size in ("tiny", "2B", "7B"):
        cfg = gemma_config(size)
        assert gemma_config_from_hf(transformers.GemmaConfig(**_hf_fields(cfg)).to_dict()) == cfg
    assert gemma_config_from_hf(transformers.GemmaConfig().to_dict()) == gemma_config("7B")
    tiny = hf_config_from_gemma(gemma_config("tiny"))
    assert gemma_config_from_hf({**tiny, "hidden_act": "gelu", "hidden_activation": None}) == gemma_config("tiny")
    for key, value in (("attention_bias", True), ("tie_word_embeddings", False), ("hidden_act", "silu")):
        with pytest.raises(ValueError, match=f"{value!r} is not supported by the gemma recipe"):
            gemma_config_from_hf({**tiny, key: value, "hidden_activation": None})
    with pytest.raises(ValueError, match="rope type 'linear' is not supported"):
        gemma_config_from_hf({**tiny, "rope_parameters": {"rope_type": "linear", "factor": 2.0}})


def test_sharded_checkpoint_and_key_errors(tmp_path):
    """Oracle: HF's own sharded save (index + shards) gives the same tensors as its state dict."""
    torch.manual_seed(0)
    hf = transformers.GemmaForCausalLM(_hf_config(*CASES["mqa"]))
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    cfg, state = import_hf_gemma(tmp_path)
    hf_state = hf.state_dict()
    assert all(torch.equal(t, hf_state[n]) for n, t in lf_to_hf_state(state, cfg).items())
    with pytest.raises(KeyError, match=r"missing \['model.norm.weight'\], unexpected \['extra'\]"):
        hf_to_lf_state({**{k: v for k, v in hf_state.items() if k != "model.norm.weight"}, "extra": 0}, cfg)
    untied = {**hf_state, "lm_head.weight": hf_state["model.embed_tokens.weight"] + 1}
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens.weight"):
        hf_to_lf_state(untied, cfg)
