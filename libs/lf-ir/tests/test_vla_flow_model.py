"""The lowered flow-matching VLA (pi0). Oracles: a float64 plain-PyTorch joint attention over the concatenated
prefix + suffix under pi0's block mask (written from the state dict), the uncached Euler sampler (one full
forward per step), flow.flow_matching_loss computed by hand, and perturbation tests of the mask."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from lf_ir import flow, materialize
from lf_ir.recipes.vla_flow import VLAFlowModel, draw_flow_noise, sample_seeds, vla_flow_config

B = 3


@pytest.fixture(scope="module")
def setup():
    cfg = vla_flow_config("tiny", text_vocab_size=30, max_instruction_len=5, image_size=32, patch_size=8,
                          action_horizon=3)
    with torch.device("meta"):
        model = VLAFlowModel(cfg)
    model = materialize(model, "cpu", 3).double().eval()
    g = torch.Generator().manual_seed(0)
    obs = dict(image=torch.randint(0, 256, (B, 32, 32, 3), dtype=torch.uint8, generator=g),
               instruction_ids=torch.randint(2, 30, (B, 5), generator=g),
               instruction_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool),
               state=torch.randn(B, 39, generator=g, dtype=torch.float64))
    noisy = torch.randn(B, 3, 4, generator=g, dtype=torch.float64)
    sigma = torch.rand(B, generator=g, dtype=torch.float64)
    return cfg, model, obs, noisy, sigma


def _ln(x, sd, key):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], sd[f"{key}.weight"], sd[f"{key}.bias"])


def _mlp(x, sd, key):
    h = torch.nn.functional.gelu(x @ sd[f"{key}.up.weight"].T + sd[f"{key}.up.bias"])
    return h @ sd[f"{key}.down.weight"].T + sd[f"{key}.down.bias"]


def _reference_velocity(model, cfg, obs, noisy, sigma):
    """Plain float64 pi0 layers: one softmax over the concatenated [prefix; suffix] with the block mask."""
    x_pre, pad = model.encode_prefix(**obs)
    x_suf = model._suffix_in(noisy, sigma)
    p, h, hd = x_pre.shape[1], x_suf.shape[1], cfg.head_dim
    allowed = torch.zeros(B, p + h, p + h, dtype=torch.bool)
    keys_ok = torch.cat([pad, torch.ones(B, h, dtype=torch.bool)], 1)
    allowed[:, :p, :p] = pad[:, None, :]  # prefix -> prefix
    allowed[:, p:, :] = keys_ok[:, None, :]  # suffix -> everything
    rep = cfg.heads // cfg.kv_heads
    for blk in model.joint_blocks:
        sd = {k: v for k, v in blk.state_dict().items()}
        streams = [("prefix", x_pre), ("suffix", x_suf)]
        hs = {s: _ln(x, sd, f"{s}.attn_norm") for s, x in streams if x is not None}
        q = torch.cat([hs[s] @ sd[f"{s}.q.weight"].T if f"{s}.q.weight" in sd else
                       torch.zeros(B, p, cfg.heads * hd, dtype=torch.float64) for s in ("prefix", "suffix")], 1)
        k = torch.cat([hs[s] @ sd[f"{s}.k.weight"].T for s in ("prefix", "suffix")], 1)
        v = torch.cat([hs[s] @ sd[f"{s}.v.weight"].T for s in ("prefix", "suffix")], 1)
        q = q.view(B, p + h, cfg.heads, hd).transpose(1, 2)
        k = k.view(B, p + h, cfg.kv_heads, hd).transpose(1, 2).repeat_interleave(rep, 1)
        v = v.view(B, p + h, cfg.kv_heads, hd).transpose(1, 2).repeat_interleave(rep, 1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        weights = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(B, p + h, -1)
        x_suf = x_suf + out[:, p:] @ sd["suffix.o.weight"].T
        x_suf = x_suf + _mlp(_ln(x_suf, sd, "suffix.mlp_norm"), sd, "suffix.mlp")
        if "prefix.q.weight" in sd:
            x_pre = x_pre + out[:, :p] @ sd["prefix.o.weight"].T
            x_pre = x_pre + _mlp(_ln(x_pre, sd, "prefix.mlp_norm"), sd, "prefix.mlp")
    return model._velocity(x_suf)


def test_velocity_equals_joint_attention_reference(setup):
    """Oracle: float64 joint attention over the concatenated sequence with pi0's block mask."""
    cfg, model, obs, noisy, sigma = setup
    with torch.no_grad():
        out = model(**obs, noisy_actions=noisy, sigma=sigma)
        ref = _reference_velocity(model, cfg, obs, noisy, sigma)
    assert out.shape == (B, cfg.action_horizon, cfg.action_dim)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


def test_block_mask_prefix_ignores_suffix_and_padding(setup):
    """The prefix cache does not depend on the actions; padded instruction tokens change nothing."""
    cfg, model, obs, noisy, sigma = setup
    with torch.no_grad():
        base = model(**obs, noisy_actions=noisy, sigma=sigma)
        changed = dict(obs, instruction_ids=obs["instruction_ids"].clone())
        changed["instruction_ids"][0, 3:] = 7  # padding of sample 0
        torch.testing.assert_close(model(**changed, noisy_actions=noisy, sigma=sigma), base, rtol=0, atol=1e-13)
        other = model(**obs, noisy_actions=noisy, sigma=sigma.flip(0))
        assert (other - base).abs().amax() > 1e-6  # flow time is seen
        moved = model(**dict(obs, state=obs["state"] + 0.5), noisy_actions=noisy, sigma=sigma)
        assert (moved - base).abs().amax(dim=(1, 2)).min() > 0  # every sample sees its prefix


def test_sample_actions_kv_cache_equals_uncached(setup):
    """Oracle: Euler integration calling the full (uncached) forward at every step, same noise."""
    cfg, model, obs, _, _ = setup
    noise = torch.randn(B, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(5),
                        dtype=torch.float64)
    cached = model.sample_actions(**obs, noise=noise)
    with torch.no_grad():
        uncached = flow.euler_sample(lambda x, s: model(**obs, noisy_actions=x, sigma=s), noise,
                                     flow.sampling_sigmas(cfg.sample_steps))
    assert cached.shape == (B, cfg.action_horizon, cfg.action_dim)
    torch.testing.assert_close(cached, uncached, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(model.sample_actions(**obs, noise=noise, steps=2), cached)


def _batch(cfg, obs, g):
    actions = torch.randn(B, cfg.action_horizon, cfg.action_dim, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    return dict(obs, actions=actions, action_mask=mask)


def test_training_loss_is_masked_velocity_mse(setup):
    """Oracle: sum over real steps of (v_pred - (noise - a))^2 with x_t = (1 - sigma) a + sigma noise."""
    cfg, model, obs, noisy, sigma = setup
    g = torch.Generator().manual_seed(1)
    batch = _batch(cfg, obs, g)
    batch.update(noise=torch.randn(B, 3, 4, generator=g, dtype=torch.float64), sigma=sigma)
    loss, extra = model.training_loss(batch)
    s = sigma.view(-1, 1, 1)
    x_t = (1 - s) * batch["actions"] + s * batch["noise"]
    with torch.no_grad():
        pred = model(**obs, noisy_actions=x_t, sigma=sigma)
    err = (pred - (batch["noise"] - batch["actions"])).square() * batch["action_mask"][..., None]
    torch.testing.assert_close(loss.detach(), err.sum(), rtol=1e-12, atol=0)
    assert extra == {} and int(model.loss_normalizer(batch)) == 6 * cfg.action_dim
    unmasked = model.training_loss(dict(batch, action_mask=torch.ones_like(batch["action_mask"])))[0]
    full = (pred - (batch["noise"] - batch["actions"])).square().sum()
    torch.testing.assert_close(unmasked.detach(), full, rtol=1e-12, atol=0)
    assert float(full) > float(err.sum())  # the padded steps' errors were left out


def test_per_sample_seeds_make_noise_independent_of_batch_split():
    """The same (seed) gives the same noise and time alone or inside a larger batch; Beta(1.5, 1) times."""
    seeds = sample_seeds(0, 7, [4, 9, 4000])
    noise, sigma = draw_flow_noise(3, 2, 4, seeds=seeds)
    n1, s1 = draw_flow_noise(1, 2, 4, seeds=seeds[1:2])
    assert torch.equal(noise[1:2], n1) and torch.equal(sigma[1:2], s1)
    _, many = draw_flow_noise(20000, 1, 1, "beta", generator=torch.Generator().manual_seed(0))
    assert 0.001 <= float(many.min()) and float(many.max()) <= 1.0
    # Beta(1.5, 1): mean 0.6, scaled by 0.999 and shifted by 0.001
    assert abs(float(many.mean()) - (0.999 * 0.6 + 0.001)) < 0.01
    with pytest.raises(ValueError, match="time_distribution"):
        draw_flow_noise(1, 1, 1, "cosine")


def test_recomputed_joint_layers_give_identical_gradients(setup):
    """Oracle: the same loss without recomputation; torch checkpoint on every joint layer changes memory only."""
    cfg, model, obs, noisy, sigma = setup
    grads = []
    for recompute in (False, True):
        model.zero_grad(set_to_none=True)
        x_pre, pad = model.encode_prefix(**obs)
        x_suf = model._suffix_in(noisy, sigma)
        for blk in model.joint_blocks:
            if recompute:
                x_pre, x_suf = checkpoint(blk, x_pre, x_suf, pad, use_reentrant=False)
            else:
                x_pre, x_suf = blk(x_pre, x_suf, pad)
        model._velocity(x_suf).square().sum().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == len(list(model.parameters()))
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])
