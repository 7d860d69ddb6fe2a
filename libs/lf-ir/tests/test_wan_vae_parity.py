"""Wan 2.1 VAE against diffusers' ``AutoencoderKLWan`` (the oracle) on the same random weights.

Tiny random config, float32. Tolerance: 1e-5 relative to the largest magnitude of the
peer's tensor (``atol = 1e-5 * max|ref|``, ``rtol = 1e-5``): both sides sum the same
products in different orders (conv3d vs conv2d kernels, 1x1 convs, SDPA), which moves
float32 results by a few ulps per layer. Gradients get 1e-4 with the same scaling:
the backward chains twice as many such sums.
"""

from __future__ import annotations

import json

import pytest
import torch

from lf_ir.interop.diffusers_wan_vae import (
    diffusers_config_from_wan_vae,
    export_diffusers_wan_vae,
    import_diffusers_wan_vae,
    load_diffusers_wan_vae,
    name_map,
    wan_vae_config_from_diffusers,
)
from lf_ir.recipes.wan_vae import wan_vae_config

diffusers = pytest.importorskip("diffusers")


def _close(got, want, rel=1e-5):
    torch.testing.assert_close(got, want, rtol=rel, atol=rel * want.abs().max().item())


@pytest.fixture(scope="module")
def peer_dir(tmp_path_factory):
    """A tiny AutoencoderKLWan with default init, norm scales perturbed off 1 (so a mis-mapped norm shows),
    saved by diffusers' own ``save_pretrained``."""
    torch.manual_seed(0)
    cfg = wan_vae_config("tiny")
    peer = diffusers.AutoencoderKLWan(**{k: v for k, v in diffusers_config_from_wan_vae(cfg).items()
                                         if not k.startswith("_")})
    with torch.no_grad():
        for name, p in peer.named_parameters():
            if name.endswith("gamma"):
                p.add_(0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("peer")
    peer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pair(peer_dir):
    peer = diffusers.AutoencoderKLWan.from_pretrained(peer_dir).eval()
    return peer, load_diffusers_wan_vae(peer_dir)


@pytest.fixture(scope="module")
def video():
    return torch.rand(2, 3, 5, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1


def test_import_reads_config_and_every_tensor(peer_dir):
    """Oracle: the peer's config.json and safetensors file."""
    cfg, state = import_diffusers_wan_vae(peer_dir)
    assert cfg == wan_vae_config("tiny")
    assert len(state) == len(name_map(cfg))
    raw = json.loads((peer_dir / "config.json").read_text())
    assert wan_vae_config_from_diffusers(raw) == cfg


@pytest.mark.parametrize("mode", ["chunked", "full"])
def test_encode_mean_logvar_and_decode_equal_the_peer(pair, video, mode):
    """Oracle: ``AutoencoderKLWan.encode`` (latent_dist mean / logvar) and ``.decode`` on the same weights."""
    peer, vae = pair
    with torch.no_grad():
        post = peer.encode(video).latent_dist
        mean, logvar = vae.encode(video, mode)
        _close(mean, post.mean)
        _close(logvar, post.logvar)
        _close(vae.decode(post.mean, mode), peer.decode(post.mean).sample)


def test_reconstruction_gradients_equal_the_peer_for_every_parameter(pair, video):
    """Oracle: the peer's parameter gradients of the same loss on ``forward`` (encode, latent mean,
    decode), mapped to lf names."""
    peer, vae = pair
    target = torch.rand(video.shape, generator=torch.Generator().manual_seed(2)) * 2 - 1
    peer.zero_grad()
    vae.zero_grad()
    ((peer(video).sample - target) ** 2).mean().backward()
    ((vae(video) - target) ** 2).mean().backward()
    peer_params = dict(peer.named_parameters())
    lf_params = dict(vae.named_parameters())
    names = name_map(vae.cfg)
    assert set(names) == set(lf_params)
    for lf, (d, d_shape, _) in names.items():
        _close(lf_params[lf].grad.reshape(d_shape), peer_params[d].grad, rel=1e-4)


def test_export_loads_in_diffusers_with_identical_outputs(pair, video, tmp_path):
    """Oracle: the peer loaded by ``AutoencoderKLWan.from_pretrained`` from lf's export gives the same
    outputs (bit for bit) as the peer the weights came from."""
    peer, vae = pair
    back = diffusers.AutoencoderKLWan.from_pretrained(export_diffusers_wan_vae(vae, tmp_path / "out")).eval()
    for key, value in peer.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    with torch.no_grad():
        a, b = peer.encode(video).latent_dist.mean, back.encode(video).latent_dist.mean
        assert torch.equal(a, b)
        assert torch.equal(peer.decode(a).sample, back.decode(a).sample)


def test_unsupported_configs_are_refused_by_name():
    cfg = diffusers_config_from_wan_vae(wan_vae_config("tiny"))
    with pytest.raises(ValueError, match=r"is_residual=True is not supported"):
        wan_vae_config_from_diffusers({**cfg, "is_residual": True})
    with pytest.raises(ValueError, match=r"patch_size=2 is not supported"):
        wan_vae_config_from_diffusers({**cfg, "patch_size": 2})
    with pytest.raises(ValueError, match=r"scale_factor_spatial=16 disagrees with the levels, which give 8"):
        wan_vae_config_from_diffusers({**cfg, "scale_factor_spatial": 16})
