"""wan_dit recipe against diffusers' WanTransformer3DModel (the oracle), float32 on the CPU.

Weights are random (every parameter perturbed, norms around 1, so that each one
matters), saved by diffusers with ``save_pretrained`` (safetensors) and imported by
lf; exported back and re-loaded by diffusers. Tolerance 1e-5 relative to the largest
output entry and, for gradients, to each tensor's largest entry: both sides run the
same float32 ops in the same order (on torch 2.13 / diffusers 0.42 they agree to a
few ulps; another SDPA kernel may round differently). Cases: odd head counts (3, 5),
non-square latent grids, several latent frames, a temporal patch of 2, out_channels
different from in_channels, with and without the cross-attention norm. Skipped
without ``diffusers`` (the ``test`` extra of lf-ir)."""

from __future__ import annotations

import msgspec
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from lf_ir import param_count  # noqa: E402
from lf_ir.flow import flow_matching_loss, interpolate  # noqa: E402
from lf_ir.interop.diffusers_wan import (  # noqa: E402
    diffusers_config_from_wan,
    diffusers_to_lf_state,
    export_diffusers_wan,
    import_diffusers_wan,
    lf_to_diffusers_state,
    load_diffusers_wan,
    wan_config_from_diffusers,
)
from lf_ir.recipes.wan_dit import WanDiTModel, build_graph, wan_dit_config  # noqa: E402

CASES = {
    # name: (heads, head_dim, patch, in/out channels, cross_attn_norm, latent (frames, height, width))
    "3heads-patch122-norm": (3, 12, (1, 2, 2), (4, 4), True, (3, 6, 10)),
    "5heads-patch222-out6": (5, 8, (2, 2, 2), (4, 6), True, (4, 8, 6)),
    "3heads-no-cross-norm": (3, 8, (1, 2, 2), (3, 5), False, (2, 10, 4)),
}
TEXT_DIM, TEXT_LEN = 20, 5


def _diffusers_model(heads, head_dim, patch, chans, cross_norm):
    return diffusers.WanTransformer3DModel(
        patch_size=patch, num_attention_heads=heads, attention_head_dim=head_dim, in_channels=chans[0],
        out_channels=chans[1], text_dim=TEXT_DIM, freq_dim=16, ffn_dim=48, num_layers=2,
        cross_attn_norm=cross_norm, eps=1e-6, rope_max_seq_len=32)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(diffusers model, lf model imported from its save_pretrained folder, inputs)."""
    heads, head_dim, patch, chans, cross_norm, (f, h, w) = CASES[request.param]
    torch.manual_seed(0)
    peer = _diffusers_model(heads, head_dim, patch, chans, cross_norm).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peer.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if "norm" in name else 0.0))
    src = tmp_path_factory.mktemp(request.param)
    peer.save_pretrained(src, safe_serialization=True)
    # 4k + 1 video frames whose latent frames the temporal patch divides (cost-model field only)
    lf = load_diffusers_wan(src, frames=13).eval()
    b = 2
    inputs = dict(latents=torch.randn(b, chans[0], f, h, w, generator=g),
                  t=torch.tensor([37.5, 912.0]), text=torch.randn(b, TEXT_LEN, TEXT_DIM, generator=g))
    return peer, lf, inputs


def _close(actual, expected, rel):
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * float(expected.abs().max()))


def test_imported_weights_give_diffusers_outputs(pair):
    peer, lf, x = pair
    with torch.no_grad():
        expected = peer(x["latents"], x["t"], x["text"], return_dict=False)[0]
        actual = lf(x["latents"], x["t"], x["text"])
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    assert actual.shape[1] == lf.cfg.out_channels and actual.shape[2:] == x["latents"].shape[2:]
    _close(actual, expected, 1e-5)


def test_same_flow_matching_loss_and_every_gradient(pair):
    """Oracle: diffusers' forward inside the rectified-flow loss written out by hand (x_t = (1 - s) x0
    + s n, t = 1000 s, target n - x0, per-sample MSE averaged). With out_channels != in_channels the
    target is a fresh (y0, yn) pair of the output's shape and lf's loss is :func:`flow_matching_loss`."""
    peer, lf, x = pair
    g = torch.Generator().manual_seed(2)
    x0 = x["latents"]
    noise = torch.randn(x0.shape, generator=g)
    sigma = torch.tensor([0.3, 0.85])
    s = sigma.view(-1, 1, 1, 1, 1)
    torch.testing.assert_close(interpolate(x0, noise, sigma), (1 - s) * x0 + s * noise, rtol=0, atol=0)
    peer.zero_grad()
    lf.zero_grad()
    peer_pred = peer((1 - s) * x0 + s * noise, sigma * 1000, x["text"], return_dict=False)[0]
    same = peer_pred.shape == x0.shape
    y0, yn = (x0, noise) if same else (torch.randn(peer_pred.shape, generator=g) for _ in range(2))
    peer_loss = ((peer_pred - (yn - y0)) ** 2).flatten(1).mean(1).mean()
    if same:
        lf_loss = lf.flow_loss(x0, x["text"], noise, sigma)
    else:
        lf_loss = flow_matching_loss(lf(interpolate(x0, noise, sigma), sigma * 1000, x["text"]), y0, yn)
    torch.testing.assert_close(lf_loss, peer_loss, rtol=1e-5, atol=0)
    peer_loss.backward()
    lf_loss.backward()
    peer_grads = {n: p.grad for n, p in peer.named_parameters()}
    lf_grads = lf_to_diffusers_state({n: p.grad for n, p in lf.named_parameters()}, lf.cfg)
    assert set(lf_grads) == set(peer_grads)
    for name, grad in peer_grads.items():
        assert grad is not None and float(grad.abs().max()) > 0, name
        _close(lf_grads[name], grad, 1e-5)


def test_export_loads_in_diffusers_with_identical_outputs(pair, tmp_path):
    peer, lf, x = pair
    export_diffusers_wan(lf, tmp_path)
    back = diffusers.WanTransformer3DModel.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    assert wan_config_from_diffusers(dict(back.config), frames=13) == lf.cfg
    with torch.no_grad():
        assert torch.equal(back(x["latents"], x["t"], x["text"], return_dict=False)[0],
                           peer(x["latents"], x["t"], x["text"], return_dict=False)[0])
    for name, tensor in peer.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


@pytest.mark.parametrize(("size", "expected"), [("1.3B", 1_418_996_800), ("14B", 14_288_491_584)])
def test_full_size_counts_match_diffusers_on_meta(size, expected):
    """Oracle: WanTransformer3DModel built on the meta device from our exported config."""
    cfg = wan_dit_config(size)
    fields = {k: v for k, v in diffusers_config_from_wan(cfg).items() if not k.startswith("_")}
    with torch.device("meta"):
        peer = diffusers.WanTransformer3DModel(**fields)
    assert sum(p.numel() for p in peer.parameters()) == param_count(build_graph(cfg)) == expected
    with torch.device("meta"):
        ours = WanDiTModel(cfg)
    assert sum(p.numel() for p in ours.parameters()) == expected
    assert {k: tuple(v.shape) for k, v in lf_to_diffusers_state(ours.state_dict(), cfg).items()} == \
        {k: tuple(v.shape) for k, v in peer.state_dict().items()}


def test_config_round_trip_and_refusals():
    """Oracle: diffusers' own config of a model built (on meta) from our exported config.json dict;
    fields diffusers does not carry (text length, video size for the cost model) keep lf's defaults."""
    for size in ("tiny", "1.3B"):
        cfg = wan_dit_config(size)
        fields = {k: v for k, v in diffusers_config_from_wan(cfg).items() if not k.startswith("_")}
        with torch.device("meta"):
            peer = diffusers.WanTransformer3DModel(**fields)
        back = wan_config_from_diffusers(dict(peer.config))
        assert back == msgspec.structs.replace(cfg, text_len=512, frames=81, height=480, width=832)
    with pytest.raises(ValueError, match=r"image_dim=1280 .*text-to-video only"):
        wan_config_from_diffusers({**diffusers_config_from_wan(wan_dit_config("tiny")), "image_dim": 1280})
    with pytest.raises(ValueError, match="rope_theta"):
        diffusers_config_from_wan(wan_dit_config("tiny", rope_theta=500.0))


def test_sharded_checkpoint_and_key_errors(tmp_path):
    """Oracle: diffusers' own sharded save (index + shards) holds the same tensors as the model."""
    torch.manual_seed(0)
    peer = _diffusers_model(3, 12, (1, 2, 2), (4, 4), True)
    peer.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "diffusion_pytorch_model.safetensors.index.json").exists()
    cfg, state = import_diffusers_wan(tmp_path)
    peer_state = peer.state_dict()
    assert all(torch.equal(t, peer_state[n]) for n, t in lf_to_diffusers_state(state, cfg).items())
    broken = {**{k: v for k, v in peer_state.items() if k != "proj_out.bias"}, "extra": torch.zeros(1)}
    with pytest.raises(KeyError, match=r"missing \['proj_out.bias'\], unexpected \['extra'\]"):
        diffusers_to_lf_state(broken, cfg)


def test_rope_tables_are_the_peers_bit_for_bit():
    """Oracle: diffusers' WanRotaryPosEmbed (float64 angles cast to float32) on a non-square grid."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    from lf_ir._nodes_video import RoPE3D
    from lf_ir._rope3d_torch import rope3d_cos_sin

    for head_dim in (8, 12, 128):
        peer = WanRotaryPosEmbed(head_dim, (1, 2, 2), max_seq_len=64)
        cos, sin = peer(torch.zeros(1, 1, 5, 14, 6))
        ours = rope3d_cos_sin(RoPE3D(max_seq_len=64), head_dim, (5, 7, 3))
        assert torch.equal(ours[0], cos) and torch.equal(ours[1], sin)
