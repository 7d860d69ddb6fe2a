"""llama3 recipe against HF transformers' LlamaForCausalLM (the oracle), float32 on the CPU.

Weights are random (not HF's init: norms and all matrices perturbed so that every
parameter matters), saved by HF with ``save_pretrained`` (safetensors) and imported by
lf; exported back and re-loaded by HF. Tolerances: 1e-5 relative to the largest
logit and, for gradients, to each tensor's largest entry (float32; the two
implementations run the same ops in the same order, so on the CPU with torch 2.13
and transformers 5.24 logits and gradients came out bit-identical, but another
SDPA or RMSNorm kernel may round differently). Skipped without ``transformers`` (the ``test``
extra of lf-ir)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lf_ir import Llama3Model, llama3_config, next_token_loss, param_count  # noqa: E402
from lf_ir.interop import (  # noqa: E402
    export_hf_llama,
    hf_config_from_llama3,
    hf_to_lf_state,
    import_hf_llama,
    lf_to_hf_state,
    llama3_config_from_hf,
    load_hf_llama,
)
from lf_ir.recipes.llama3 import build_graph  # noqa: E402

CASES = {
    # name: (heads, kv_heads, head_dim, llama3 rope scaling, tied embeddings)
    "mha-llama3-untied": (4, 4, 16, True, False),
    "gqa2-plain-tied": (4, 2, 16, False, True),
    "gqa4-llama3-tied": (8, 2, 8, True, True),
    "odd3heads-gqa3-llama3-untied": (3, 1, 8, True, False),
    "odd3heads-mha-plain-untied": (3, 3, 8, False, False),
}


def _hf_config(heads, kv_heads, head_dim, llama3, tied):
    # original_max_position_embeddings chosen so that the three llama3 bands all occur
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32 if head_dim == 16 else 64} if llama3 else None
    return transformers.LlamaConfig(
        vocab_size=96, hidden_size=heads * head_dim, intermediate_size=56, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=scaling, tie_word_embeddings=tied)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(HF model, lf model imported from HF's save_pretrained folder, token ids)."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(_hf_config(*CASES[request.param])).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if "norm" in name else 0.0))
    src = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(src, safe_serialization=True)
    assert (src / "model.safetensors").exists()
    lf = load_hf_llama(src).eval()
    ids = torch.randint(0, 96, (2, 40), generator=g)
    return hf, lf, ids


def _close(actual, expected, rel):
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * float(expected.abs().max()))


def test_imported_weights_give_hf_logits(pair):
    hf, lf, ids = pair
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        actual = lf(ids)
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    _close(actual, expected, 1e-5)
    positions = torch.arange(ids.shape[1]).expand_as(ids) + torch.tensor([[3], [70]])  # e.g. a packed document
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
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}
    lf_grads = lf_to_hf_state({n: p.grad for n, p in lf.named_parameters()}, lf.cfg)
    assert set(lf_grads) == set(hf_grads)
    for name, grad in hf_grads.items():
        assert grad is not None and float(grad.abs().max()) > 0, name
        _close(lf_grads[name], grad, 1e-5)


def test_export_loads_in_hf_with_identical_outputs(pair, tmp_path):
    hf, lf, ids = pair
    export_hf_llama(lf, tmp_path)
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    assert llama3_config_from_hf(back.config.to_dict()) == lf.cfg
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, hf(input_ids=ids).logits)
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def _hf_fields(cfg):
    """LlamaConfig keyword arguments from our config.json dict (less the keys only files carry)."""
    return {k: v for k, v in hf_config_from_llama3(cfg).items() if k not in ("model_type", "torch_dtype", "dtype")}


@pytest.mark.parametrize(("size", "expected"), [("1B", 1_235_814_400), ("8B", 8_030_261_248),
                                                ("70B", 70_553_706_496)])
def test_full_size_counts_match_hf_on_meta(size, expected):
    """Oracle: LlamaForCausalLM built on the meta device from the equivalent LlamaConfig."""
    cfg = llama3_config(size)
    fields = _hf_fields(cfg)
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    assert sum(p.numel() for p in hf.parameters()) == param_count(build_graph(cfg)) == expected


def test_hf_config_round_trip():
    """Oracle: LlamaConfig's own serialization of our exported config."""
    for size in ("tiny", "1B", "8B", "70B"):
        cfg = llama3_config(size)
        fields = _hf_fields(cfg)
        assert llama3_config_from_hf(transformers.LlamaConfig(**fields).to_dict()) == cfg
    assert llama3_config_from_hf(transformers.LlamaConfig(num_attention_heads=4, hidden_size=64,
                                                          intermediate_size=8).to_dict()).rope_scaling == "none"
    with pytest.raises(ValueError, match="attention_bias=True"):
        llama3_config_from_hf({**hf_config_from_llama3(llama3_config("tiny")), "attention_bias": True})


def test_lf_model_built_from_config_is_a_llama3_model(pair):
    _, lf, _ = pair
    assert isinstance(lf, Llama3Model) and len(lf.blocks) == 2


def test_sharded_checkpoint_and_key_errors(tmp_path):
    """Oracle: HF's own sharded save (index + shards) gives the same tensors as its single-file save."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(_hf_config(4, 2, 16, True, False))
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    cfg, state = import_hf_llama(tmp_path)
    hf_state = hf.state_dict()
    assert all(torch.equal(t, hf_state[n]) for n, t in lf_to_hf_state(state, cfg).items())
    with pytest.raises(KeyError, match=r"missing \['model.norm.weight'\], unexpected \['extra'\]"):
        hf_to_lf_state({**{k: v for k, v in hf_state.items() if k != "model.norm.weight"}, "extra": 0}, cfg)
