"""Chunked (first frame, then 4 frames at a time, with the feature cache) against full-clip runs of the
Wan VAE. Oracle: the full-clip run on the same weights. In float64 they agree to 1e-12 (the same sums);
in float32 to 1e-5 relative to the output scale (``atol = 1e-5 * max|full|``: the chunked run sums the
same products, in convolutions of other shapes, so a few ulps apart per layer)."""

from __future__ import annotations

import pytest
import torch

from lf_ir import materialize
from lf_ir.recipes.wan_vae import WanVAE, wan_vae_config


@pytest.fixture(scope="module")
def vae():
    with torch.device("meta"):
        model = WanVAE(wan_vae_config("tiny"))
    model = materialize(model, "cpu", seed=3)
    with torch.no_grad():  # lf init gives std-0.02 convs, which shrink activations toward 0: scale them up
        for name, p in model.named_parameters():
            p.mul_(10.0 if name.endswith("weight") and p.dim() == 5 else 1.0)
    return model


@pytest.mark.parametrize(("k", "dtype", "tol"), [(1, torch.float32, 1e-5), (2, torch.float32, 1e-5),
                                                  (2, torch.float64, 1e-12)])
def test_chunked_encode_equals_full_encode(vae, k, dtype, tol):
    """4k+1 frames, k = 1 and 2: mean and log-variance of the chunked encode vs the full-clip encode."""
    model = vae.to(dtype)
    video = (torch.rand(1, 3, 4 * k + 1, 16, 24, generator=torch.Generator().manual_seed(k)) * 2 - 1).to(dtype)
    with torch.no_grad():
        full, chunked = model.encode(video, "full"), model.encode(video, "chunked")
    assert full[0].shape == (1, 4, k + 1, 2, 3) and full[0].abs().max() > 1e-2
    for a, b in zip(chunked, full, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * b.abs().max().item())
    vae.float()


def test_chunked_decode_equals_full_decode(vae):
    """Latents of 3 frames: per-latent-frame decode with the cache vs the whole clip at once (float64)."""
    model = vae.double()
    latent = torch.randn(1, 4, 3, 2, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        full, chunked = model.decode(latent, "full"), model.decode(latent, "chunked")
    assert full.shape == (1, 3, 9, 16, 16) and full.abs().max() > 1e-2
    torch.testing.assert_close(chunked, full, rtol=1e-12, atol=1e-12)
    vae.float()


@pytest.mark.parametrize("cuts", [((0, 1), (1, 9)), ((0, 5), (5, 9))])
def test_other_chunkings_stream_like_the_full_clip(vae, cuts):
    """Chunks other than diffusers' 1 + 4 + 4 (any cut at 1 + 4j frames, so that every level gets frames)
    through the encoder stages equal the full run (float64)."""
    model = vae.double()
    video = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    with torch.no_grad():
        full = model._run(model.encoder, video, None)
        cache = {}
        parts = [model._run(model.encoder, video[:, :, a:b], cache) for a, b in cuts]
    torch.testing.assert_close(torch.cat(parts, 2), full, rtol=1e-12, atol=1e-12)
    vae.float()
