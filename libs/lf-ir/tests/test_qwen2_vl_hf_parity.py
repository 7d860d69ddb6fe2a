"""qwen2_vl recipe against HF transformers' Qwen2VLForConditionalGeneration (the oracle), float32 on the CPU.

Weights are random (norms and every matrix perturbed so that every parameter matters),
saved by HF with ``save_pretrained`` (safetensors) and imported by lf; exported back
and re-loaded by HF. Batches hold text plus images of different sizes (one of two
frames, so temporal M-RoPE ids and per-frame ViT attention are exercised), or text
only. Tolerances: 1e-5 relative to the largest logit and, for gradients, to each
tensor's largest entry (float32; both sides run the same ops, but lf computes the ViT's
q/k/v as three matmuls where HF runs one fused matmul, so last-bit rounding may
differ). Skipped without ``transformers`` (the ``test`` extra of lf-ir)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lf_ir import param_count  # noqa: E402
from lf_ir.interop.hf_qwen2_vl import (  # noqa: E402
    export_hf_qwen2_vl,
    hf_config_from_qwen2_vl,
    import_hf_qwen2_vl,
    lf_to_hf_state,
    load_hf_qwen2_vl,
    normalize_hf_names,
    qwen2_vl_config_from_hf,
)
from lf_ir.recipes.llama3 import next_token_loss  # noqa: E402
from lf_ir.recipes.qwen2_vl import Qwen2VLModel, build_graph, qwen2_vl_config  # noqa: E402

IMG, VS, VE, VOCAB, PATCH = 120, 121, 122, 128, 3 * 2 * 14 * 14
CASES = {
    # name: (heads, kv_heads, head_dim, mrope_section, vision heads, vision head_dim, tied)
    "gqa2-untied": (4, 2, 16, (2, 3, 3), 2, 16, False),
    "odd3heads-gqa3-tied": (3, 1, 16, (4, 2, 2), 3, 8, True),
    "mha-untied": (2, 2, 12, (2, 2, 2), 1, 12, False),
}
GRIDS = torch.tensor([[1, 4, 6], [1, 2, 4], [2, 4, 4]])  # merged tokens: 6, 2, 8


def _hf_config(heads, kv_heads, head_dim, section, vheads, vhead_dim, tied):
    return transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=heads * head_dim, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=1e-6,
                         bos_token_id=1, eos_token_id=2,
                         rope_parameters={"rope_type": "default", "mrope_section": list(section), "rope_theta": 1e4}),
        vision_config=dict(depth=2, embed_dim=vheads * vhead_dim, num_heads=vheads, mlp_ratio=2,
                           hidden_size=heads * head_dim),
        image_token_id=IMG, video_token_id=123, vision_start_token_id=VS, vision_end_token_id=VE,
        tie_word_embeddings=tied)


def _batch(g):
    """Two samples: text, image 0, text, image 1, text / text, image 2 (two frames), text; 32 tokens each."""
    def text(n):
        return torch.randint(0, 100, (n,), generator=g).tolist()
    row0 = text(3) + [VS] + [IMG] * 6 + [VE] + text(4) + [VS] + [IMG] * 2 + [VE] + text(13)
    row1 = text(5) + [VS] + [IMG] * 8 + [VE] + text(17)
    ids = torch.tensor([row0, row1])
    pixels = torch.randn(int(GRIDS.prod(-1).sum()), PATCH, generator=g)
    return ids, pixels


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(HF model, lf model imported from HF's save_pretrained folder, ids, pixels)."""
    torch.manual_seed(0)
    hf = transformers.Qwen2VLForConditionalGeneration(_hf_config(*CASES[request.param])).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            is_norm = "norm" in name or "ln_q" in name
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if is_norm and name.endswith("weight") else 0.0))
    src = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(src, safe_serialization=True)
    lf = load_hf_qwen2_vl(src).eval()
    return hf, lf, *_batch(g)


def _hf_logits(hf, ids, pixels=None, **kw):
    if pixels is not None:
        kw.update(pixel_values=pixels, image_grid_thw=GRIDS, mm_token_type_ids=(ids == IMG).int())
    return hf(input_ids=ids, **kw)


def _close(actual, expected, rel):
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * float(expected.abs().max()))


def test_imported_weights_give_hf_logits_with_images(pair):
    hf, lf, ids, pixels = pair
    with torch.no_grad():
        expected = _hf_logits(hf, ids, pixels).logits
        actual = lf(ids, pixels, GRIDS)
    assert actual.shape == expected.shape == (2, 32, VOCAB)
    _close(actual, expected, 1e-5)
    with torch.no_grad():  # the images matter: other pixels give other logits
        assert not torch.allclose(lf(ids, pixels.flip(0), GRIDS), actual, atol=1e-3)


def test_text_only_batch_gives_hf_logits(pair):
    hf, lf, ids, _ = pair
    text = ids.clamp(max=99)
    with torch.no_grad():
        _close(lf(text), _hf_logits(hf, text).logits, 1e-5)


def test_same_loss_and_every_gradient(pair):
    """Labels: the ids with image placeholders ignored (-100), HF's ForCausalLMLoss shifts them."""
    hf, lf, ids, pixels = pair
    labels = ids.masked_fill(ids == IMG, -100)
    hf.zero_grad()
    lf.zero_grad()
    hf_loss = _hf_logits(hf, ids, pixels, labels=labels).loss
    lf_loss = next_token_loss(lf(ids, pixels, GRIDS), labels)
    torch.testing.assert_close(lf_loss, hf_loss, rtol=1e-5, atol=0)
    hf_loss.backward()
    lf_loss.backward()
    hf_grads = normalize_hf_names({n: p.grad for n, p in hf.named_parameters()})
    lf_grads = lf_to_hf_state({n: p.grad for n, p in lf.named_parameters()}, lf.cfg)
    assert set(lf_grads) == set(hf_grads)
    for name, grad in hf_grads.items():
        assert grad is not None and float(grad.abs().max()) > 0, name
        _close(lf_grads[name], grad, 1e-5)


def test_export_loads_in_hf_with_identical_outputs(pair, tmp_path):
    hf, lf, ids, pixels = pair
    export_hf_qwen2_vl(lf, tmp_path)
    back = transformers.Qwen2VLForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert qwen2_vl_config_from_hf(back.config.to_dict()) == lf.cfg
    with torch.no_grad():
        assert torch.equal(_hf_logits(back, ids, pixels).logits, _hf_logits(hf, ids, pixels).logits)
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def _hf_fields(cfg):
    """Qwen2VLConfig keyword arguments from our config.json dict (less the keys only files carry)."""
    return {k: v for k, v in hf_config_from_qwen2_vl(cfg).items() if k not in ("model_type", "torch_dtype", "dtype")}


@pytest.mark.parametrize(("size", "published"), [("2B", 2_208_985_600), ("7B", 8_291_375_616)])
def test_full_size_counts_match_hf_on_meta(size, published):
    """Oracles: Qwen2VLForConditionalGeneration built on the meta device from the equivalent config (exact),
    and the published totals of Qwen2-VL-2B/7B-Instruct (to 0.1%; here exact too)."""
    cfg = qwen2_vl_config(size)
    with torch.device("meta"):
        hf = transformers.Qwen2VLForConditionalGeneration(transformers.Qwen2VLConfig(**_hf_fields(cfg)))
    ours = param_count(build_graph(cfg))
    assert sum(p.numel() for p in hf.parameters()) == ours
    assert abs(ours - published) / published < 1e-3


def test_hf_config_round_trip_and_flat_legacy_form():
    """Oracle: Qwen2VLConfig's own serialization; the flat 4.x config.json of Qwen2-VL-7B-Instruct."""
    for size in ("tiny", "2B", "7B"):
        cfg = qwen2_vl_config(size)
        assert qwen2_vl_config_from_hf(transformers.Qwen2VLConfig(**_hf_fields(cfg)).to_dict()) == cfg
    legacy = {"architectures": ["Qwen2VLForConditionalGeneration"], "hidden_act": "silu", "hidden_size": 3584,
              "intermediate_size": 18944, "max_position_embeddings": 32768, "model_type": "qwen2_vl",
              "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
              "rope_theta": 1000000.0, "tie_word_embeddings": False, "use_sliding_window": False,
              "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                                "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
                                "temporal_patch_size": 2},
              "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064,
              "image_token_id": 151655, "video_token_id": 151656}
    assert qwen2_vl_config_from_hf(legacy) == qwen2_vl_config("7B")
    with pytest.raises(ValueError, match="use_sliding_window=True"):
        qwen2_vl_config_from_hf({**legacy, "use_sliding_window": True})


def test_import_returns_lf_names_and_the_model_is_lowered(pair):
    _, lf, _, _ = pair
    assert isinstance(lf, Qwen2VLModel) and len(lf.blocks) == 4


def test_sharded_checkpoint_import(tmp_path):
    """Oracle: HF's own sharded save (index + shards) gives back every tensor of its state dict."""
    torch.manual_seed(0)
    hf = transformers.Qwen2VLForConditionalGeneration(_hf_config(*CASES["gqa2-untied"]))
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    cfg, state = import_hf_qwen2_vl(tmp_path)
    hf_state = normalize_hf_names(hf.state_dict())
    assert all(torch.equal(t, hf_state[n]) for n, t in lf_to_hf_state(state, cfg).items())


def test_position_ids_match_hf(pair):
    """Oracles: HF's ``get_rope_index`` (with left and right padding), ``get_vision_position_ids`` and
    ``get_vision_cu_seqlens``."""
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids

    from lf_ir._mm_positions import mrope_position_ids, vision_patch_positions, vision_segments

    hf, lf, ids, _ = pair
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[1, -3:] = 0
    for attention_mask in (None, mask):
        expected, _ = hf.model.get_rope_index(ids, (ids == IMG).int(), image_grid_thw=GRIDS,
                                              attention_mask=attention_mask)
        actual = mrope_position_ids(ids, GRIDS, image_token_id=IMG, spatial_merge_size=2,
                                    attention_mask=attention_mask)
        assert torch.equal(actual, expected)
    assert torch.equal(vision_patch_positions(GRIDS, 2), get_vision_position_ids(GRIDS, 2))
    assert torch.equal(torch.tensor([0, *vision_segments(GRIDS)]).cumsum(0), get_vision_cu_seqlens(GRIDS).long())


def test_padded_batch_gives_hf_logits_on_real_tokens(pair):
    """Oracle: HF with the same attention_mask (left padding in one sample, right in the other); padded
    query rows are not compared (neither side defines them)."""
    hf, lf, ids, pixels = pair
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[1, -3:] = 0
    with torch.no_grad():
        expected = _hf_logits(hf, ids, pixels, attention_mask=mask).logits
        actual = lf(ids, pixels, GRIDS, attention_mask=mask)
    keep = mask.bool()
    _close(actual[keep], expected[keep], 1e-5)
