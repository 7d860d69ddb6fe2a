"""The lowered VLA obeys its prefix-LM sequence layout. Oracle: perturbation tests (what may
and may not change the logits) and a float64 re-computation with the dense-mask reference."""

from __future__ import annotations

import pytest
import torch

from lf_ir import VLAModel, materialize, vla_config


@pytest.fixture(scope="module")
def setup():
    cfg = vla_config("tiny", text_vocab_size=30, max_instruction_len=5, image_size=32,
                     patch_size=8, action_horizon=2)
    with torch.device("meta"):
        model = VLAModel(cfg)
    model = materialize(model, "cpu", 3).double().eval()
    g = torch.Generator().manual_seed(0)
    b = 2
    inputs = dict(image=torch.randint(0, 256, (b, 32, 32, 3), dtype=torch.uint8, generator=g),
                  instruction_ids=torch.randint(2, 30, (b, 5), generator=g),
                  instruction_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool),
                  state=torch.randn(b, 39, generator=g, dtype=torch.float64),
                  action_in_ids=torch.randint(30, 30 + 256, (b, cfg.num_action_tokens - 1),
                                              generator=g))
    return cfg, model, inputs


def _logits(model, **inputs):
    with torch.no_grad():
        return model(**inputs)


def test_shapes(setup):
    cfg, model, inputs = setup
    out = _logits(model, **inputs)
    assert out.shape == (2, cfg.num_action_tokens, cfg.vocab_size)


def test_action_positions_are_causal(setup):
    """Changing action token j changes predictions at positions > j only."""
    cfg, model, inputs = setup
    base = _logits(model, **inputs)
    changed = dict(inputs, action_in_ids=inputs["action_in_ids"].clone())
    j = 3
    changed["action_in_ids"][:, j] = 30 + (changed["action_in_ids"][:, j] - 30 + 7) % 256
    out = _logits(model, **changed)
    # logits position p predicts action token p from inputs < p; input token j sits at position j + 1
    assert torch.equal(out[:, : j + 1], base[:, : j + 1])
    assert not torch.allclose(out[:, j + 1:], base[:, j + 1:])


def test_padded_instruction_tokens_are_ignored(setup):
    cfg, model, inputs = setup
    base = _logits(model, **inputs)
    changed = dict(inputs, instruction_ids=inputs["instruction_ids"].clone())
    changed["instruction_ids"][0, 3:] = 7  # padding positions of sample 0
    out = _logits(model, **changed)
    torch.testing.assert_close(out, base, rtol=1e-12, atol=1e-12)


def test_prefix_is_seen_by_every_action_position(setup):
    cfg, model, inputs = setup
    base = _logits(model, **inputs)
    out = _logits(model, **dict(inputs, state=inputs["state"] + 0.5))
    assert (out - base).abs().amax(dim=-1).min() > 0


def test_generate_returns_action_tokens_consistent_with_forward(setup):
    """Oracle: greedy decoding re-fed through the teacher-forced forward gives the same argmax."""
    cfg, model, inputs = setup
    obs = {k: inputs[k] for k in ("image", "instruction_ids", "instruction_mask", "state")}
    ids = model.generate(**obs)
    assert ids.shape == (2, cfg.num_action_tokens)
    assert bool(((ids >= cfg.text_vocab_size) & (ids < cfg.vocab_size)).all())
    logits = _logits(model, **obs, action_in_ids=ids[:, :-1])
    assert torch.equal(logits[..., cfg.text_vocab_size:].argmax(-1) + cfg.text_vocab_size, ids)


def test_wrong_image_shape_is_a_clear_error(setup):
    cfg, model, inputs = setup
    with pytest.raises(ValueError, match=r"image: expected \(batch, 32, 32, 3\)"):
        model(**dict(inputs, image=inputs["image"][:, :16]))
