"""The wan_vae recipe from the IR. Oracles: diffusers' ``AutoencoderKLWan`` instantiated on the meta
device (parameter counts), the lowered module's own parameters, FlopCounterMode on the lowered tiny
model, JSON round trip, and a float64 run of the whole clip against its chunked run."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lf_ir import from_json, materialize, node_backward_flops, param_count, to_json
from lf_ir.recipes.wan_vae import WanVAE, build_graph, decode_flops, encode_flops, latent_shape, wan_vae_config


@pytest.mark.parametrize("size", ["tiny", "wan2.1"])
def test_param_count_equals_the_peer_on_meta(size):
    """Oracle: ``AutoencoderKLWan`` with the same config on the meta device (126,892,531 for wan2.1),
    and the lowered lf module."""
    diffusers = pytest.importorskip("diffusers")
    from lf_ir.interop.diffusers_wan_vae import diffusers_config_from_wan_vae
    cfg = wan_vae_config(size)
    with torch.device("meta"):
        peer = diffusers.AutoencoderKLWan(**{k: v for k, v in diffusers_config_from_wan_vae(cfg).items()
                                             if not k.startswith("_")})
        vae = WanVAE(cfg)
    n = sum(p.numel() for p in peer.parameters())
    assert param_count(vae.graph) == n == sum(p.numel() for p in vae.parameters())
    if size == "wan2.1":
        assert n == 126_892_531


def test_forward_and_backward_flops_match_flop_counter(monkeypatch):
    """Oracle: FlopCounterMode on the lowered tiny model (full-clip encode + decode, attention by explicit
    matmuls, which the counter sees on the CPU), forward alone and forward + backward. The video requires
    grad so that the first conv's input gradient is computed, as the IR's backward = 2 x forward assumes."""
    import lf_ir._lower_vae as lower_vae
    from lf_kernels import attention_reference

    monkeypatch.setattr(lower_vae, "attention", lambda q, k, v, mask: attention_reference(q, k, v, mask)[0])
    cfg = wan_vae_config("tiny")
    b, t, h, w = 1, 5, 16, 24
    graph = build_graph(cfg, t, h, w)
    with torch.device("meta"):
        vae = WanVAE(cfg, graph)
    vae = materialize(vae, "cpu", 0)
    video = torch.randn(b, 3, t, h, w, requires_grad=True)
    fwd = encode_flops(cfg, t, h, w, b) + decode_flops(cfg, t, h, w, b)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        vae(video, "full")
    assert abs(counter.get_total_flops() - fwd) / fwd < 0.02, (counter.get_total_flops(), fwd)
    step = FlopCounterMode(display=False)
    with step:
        vae(video, "full").square().mean().backward()
    bwd = sum(node_backward_flops(n, b, c.seq_len) for c in graph.components for n in c.nodes)
    assert abs(step.get_total_flops() - (fwd + bwd)) / (fwd + bwd) < 0.02, (step.get_total_flops(), fwd + bwd)


def test_graph_levels_json_round_trip_and_published_flops():
    """Oracle: the level geometry of a 4x8x8 VAE worked out by hand; decode(encode(graph)) == graph."""
    cfg = wan_vae_config("wan2.1")
    g = build_graph(cfg, 81, 480, 832)
    assert [c.seq_len for c in g.components[:4]] == [81 * 480 * 832, 81 * 240 * 416, 41 * 120 * 208, 21 * 60 * 104]
    assert [c.seq_len for c in g.components[4:]] == [21 * 60 * 104, 41 * 120 * 208, 81 * 240 * 416, 81 * 480 * 832]
    assert from_json(to_json(g)) == g
    assert b'"op":"vae_resample"' in to_json(g)
    assert latent_shape(cfg, 81, 480, 832) == (21, 60, 104)
    # conv_in alone: 2 * voxels * 3 * 96 * 27
    assert g.components[0].nodes[0].forward_flops(1, 81 * 480 * 832) == 2 * 81 * 480 * 832 * 3 * 96 * 27
    assert 1.6e14 < encode_flops(cfg, 81, 480, 832) < 1.7e14


def test_bad_clips_and_configs_fail_naming_the_value():
    cfg = wan_vae_config("tiny")
    with pytest.raises(ValueError, match="frames must be 1 \\+ 4 \\* k, got 8"):
        build_graph(cfg, 8, 16, 16)
    with pytest.raises(ValueError, match="multiples of 8, got 12 x 16"):
        latent_shape(cfg, 5, 12, 16)
    with pytest.raises(ValueError, match="model.temperal_downsample must have len"):
        wan_vae_config("tiny", temperal_downsample=(True,))
    with pytest.raises(ValueError, match="model.size: unknown wan_vae size 'huge'"):
        wan_vae_config("huge")
    with torch.device("meta"):
        vae = WanVAE(cfg)
    with pytest.raises(ValueError, match=r"video: expected \(batch, 3, frames, height, width\), got \(1, 4, 5, 8, 8\)"):
        vae.encode(torch.zeros(1, 4, 5, 8, 8, device="meta"))
    with pytest.raises(ValueError, match="encode mode must be 'chunked' or 'full', got 'tiled'"):
        vae.encode(torch.zeros(1, 3, 5, 8, 8, device="meta"), "tiled")
