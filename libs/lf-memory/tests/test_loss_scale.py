"""DynamicLossScaler: fp16 autocast on CPU survives injected inf / NaN gradients.

Oracle: the dynamic loss scaling rule of Micikevicius et al. 2018 (skip the
step and multiply the scale by backoff_factor on inf/NaN; multiply it by
growth_factor after growth_interval finite steps in a row) and the parameters
before the step (a skipped step leaves them bitwise unchanged).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lf_memory import DynamicLossScaler


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt


def _step(model, opt, scaler, poison=None):
    """One fp16-autocast step; ``poison`` (inf or nan) is written into one gradient."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    assert out.dtype == torch.float16
    loss = out.float().square().mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    if poison is not None:
        model[0].weight.grad[0, 0] = poison
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)
    skipped = scaler.update()
    unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    return skipped, unchanged


def test_inf_and_nan_skip_the_step_halve_the_scale_then_growth():
    """Oracle: module docstring rule with init 2**10, backoff 0.5, growth 2 after 3 good steps."""
    model, opt = _setup()
    scaler = DynamicLossScaler("cpu", init_scale=2.0**10, growth_interval=3)
    assert _step(model, opt, scaler) == (False, False)  # trained, scale kept (1 good step)
    assert scaler.get_scale() == 2.0**10
    assert _step(model, opt, scaler, float("inf")) == (True, True)  # skipped: params unchanged
    assert scaler.get_scale() == 2.0**9 and scaler.skipped_steps == 1 and scaler.last_step_skipped
    assert _step(model, opt, scaler, float("nan")) == (True, True)
    assert scaler.get_scale() == 2.0**8 and scaler.skipped_steps == 2
    for expected in (2.0**8, 2.0**8, 2.0**9):  # the growth tracker restarted at the skip
        assert _step(model, opt, scaler) == (False, False)
        assert scaler.get_scale() == expected
    assert not scaler.last_step_skipped
    assert scaler.log_fields() == {"loss_scale": 2.0**9, "skipped_steps": 2}
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_state_dict_round_trip():
    """Oracle: the saved scale, growth tracker and skipped count come back in a fresh scaler."""
    model, opt = _setup()
    scaler = DynamicLossScaler("cpu", init_scale=2.0**12, growth_interval=2)
    _step(model, opt, scaler, float("inf"))
    _step(model, opt, scaler)
    state = scaler.state_dict()
    assert state["skipped_steps"] == 1 and state["scale"] == 2.0**11
    restored = DynamicLossScaler("cpu", growth_interval=2)
    restored.load_state_dict(state)
    assert restored.log_fields() == {"loss_scale": 2.0**11, "skipped_steps": 1}
    _step(model, opt, restored)  # second good step in a row: grows
    assert restored.get_scale() == 2.0**12


def test_disabled_is_a_pass_through():
    """Oracle: enabled=False (bf16 / fp32): loss unscaled, scale 1, nothing counted."""
    scaler = DynamicLossScaler("cpu", enabled=False)
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    assert scaler.update() is False and scaler.skipped_steps == 0


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"growth_factor": 1.0}, "growth_factor must be > 1, got 1.0"),
    ({"backoff_factor": 1.0}, "backoff_factor must be in (0, 1), got 1.0"),
    ({"growth_interval": 0}, "growth_interval must be an int >= 1, got 0"),
    ({"init_scale": 0.0}, "init_scale must be > 0, got 0.0"),
])
def test_bad_settings_raise(kwargs, needle):
    """Oracle: the contract (ValueError naming the field and the value)."""
    with pytest.raises(ValueError) as err:
        DynamicLossScaler("cpu", **kwargs)
    assert needle in str(err.value)
