"""lf_ir.flow against closed forms: the SD3 shift formula and its inverse, the straight-path
interpolation and its derivative, the velocity MSE of a known error, Euler steps on fields whose
Euler solution is known exactly; and against diffusers' SD3 training utilities (the peer) for the
logit-normal draws and the loss weights (skipped without diffusers)."""

from __future__ import annotations

import math

import pytest
import torch

from lf_ir import IRError, lower_node
from lf_ir.flow import (
    FlowMatchingLoss,
    euler_sample,
    flow_matching_loss,
    interpolate,
    loss_weight,
    sample_sigmas,
    sampling_sigmas,
    shift_sigma,
    timesteps_from_sigmas,
    velocity_target,
)


def test_shift_formula_closed_form_and_inverse():
    """Oracle: sigma' = s sigma / (1 + (s - 1) sigma), inverse sigma = sigma' / (s - (s - 1) sigma')."""
    assert shift_sigma(0.5, 3.0) == 0.75 and shift_sigma(0.25, 5.0) == 1.25 / 2.0
    sigma = torch.linspace(0, 1, 101, dtype=torch.float64)
    for s in (0.5, 1.0, 3.0, 5.0):
        out = shift_sigma(sigma, s)
        assert out[0] == 0 and out[-1] == 1 and bool((out.diff() > 0).all())
        torch.testing.assert_close(out / (s - (s - 1) * out), sigma, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(shift_sigma(sigma, 1.0), sigma, rtol=0, atol=0)
    with pytest.raises(ValueError, match="shift must be positive, got 0"):
        shift_sigma(sigma, 0)


def test_sample_sigmas_are_shifted_base_draws():
    """Oracle: the same generator's U(0, 1) / sigmoid(N(m, s)) draws pushed through the shift by hand."""
    u = torch.rand(64, generator=torch.Generator().manual_seed(3))
    got = sample_sigmas(64, shift=3.0, generator=torch.Generator().manual_seed(3))
    assert got.dtype == torch.float32 and got.shape == (64,)
    torch.testing.assert_close(got, 3 * u / (1 + 2 * u), rtol=1e-6, atol=0)
    n = torch.normal(0.5, 0.8, size=(64,), generator=torch.Generator().manual_seed(4))
    got = sample_sigmas(64, distribution="logit_normal", logit_mean=0.5, logit_std=0.8,
                        generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(got, 1 / (1 + torch.exp(-n)), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="distribution must be 'uniform' or 'logit_normal', got 'mode'"):
        sample_sigmas(4, distribution="mode")
    with pytest.raises(ValueError, match="logit_std must be positive"):
        sample_sigmas(4, distribution="logit_normal", logit_std=0.0)


def test_sigma_draws_and_weights_match_diffusers_sd3_utilities():
    """Oracle: diffusers.training_utils (compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3)."""
    training_utils = pytest.importorskip("diffusers.training_utils")
    ref = training_utils.compute_density_for_timestep_sampling(
        "logit_normal", 32, logit_mean=-0.3, logit_std=1.2, generator=torch.Generator().manual_seed(5))
    got = sample_sigmas(32, distribution="logit_normal", logit_mean=-0.3, logit_std=1.2,
                        generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    sigma = torch.rand(16) * 0.98 + 0.01
    for scheme in ("sigma_sqrt", "cosmap"):
        torch.testing.assert_close(loss_weight(sigma, scheme),
                                   training_utils.compute_loss_weighting_for_sd3(scheme, sigma).float(),
                                   rtol=1e-6, atol=0)
    torch.testing.assert_close(loss_weight(sigma, "none"), torch.ones(16), rtol=0, atol=0)


def test_interpolation_endpoints_and_velocity_is_its_derivative():
    """Oracle: x_0 = x0, x_1 = noise, and d x_t / d sigma = noise - x0 (autograd of the straight path)."""
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(3, 2, 5, generator=g), torch.randn(3, 2, 5, generator=g)
    torch.testing.assert_close(interpolate(x0, noise, torch.zeros(3)), x0, rtol=0, atol=0)
    torch.testing.assert_close(interpolate(x0, noise, torch.ones(3)), noise, rtol=0, atol=0)
    sigma = torch.tensor([0.2, 0.5, 0.9], requires_grad=True)
    jac = torch.autograd.functional.jacobian(lambda s: interpolate(x0, noise, s).sum(dim=(1, 2)), sigma)
    torch.testing.assert_close(torch.diagonal(jac), velocity_target(x0, noise).sum(dim=(1, 2)))
    x_half = interpolate(x0.half(), noise.half(), torch.full((3,), 0.5))
    assert x_half.dtype == torch.float32  # float32 math for half inputs
    assert timesteps_from_sigmas(torch.tensor([0.25])).item() == 250.0
    with pytest.raises(ValueError, match=r"sigma: expected shape \(3,\) \(one per sample\), got \(2,\)"):
        interpolate(x0, noise, torch.zeros(2))
    with pytest.raises(ValueError, match=r"noise: shape \(3, 2, 4\) differs from x0 \(3, 2, 5\)"):
        interpolate(x0, noise[..., :4], torch.zeros(3))


def test_loss_of_a_known_error_and_per_sample_weights():
    """Oracle: pred = target + c_b gives per-sample MSE c_b^2; weighted mean by hand; a float64 random case."""
    g = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(4, 3, 6, generator=g), torch.randn(4, 3, 6, generator=g)
    c = torch.tensor([0.0, 0.5, -1.0, 2.0])
    pred = (noise - x0) + c.view(-1, 1, 1)
    torch.testing.assert_close(flow_matching_loss(pred, x0, noise, per_sample=True), c ** 2)
    w = torch.tensor([1.0, 2.0, 0.5, 0.25])
    torch.testing.assert_close(flow_matching_loss(pred, x0, noise, w), (w * c ** 2).mean())
    p64 = torch.randn(4, 3, 6, dtype=torch.float64, generator=g)
    ref = ((p64 - (noise.double() - x0.double())) ** 2).mean()
    torch.testing.assert_close(flow_matching_loss(p64, x0.double(), noise.double()), ref, rtol=1e-12, atol=0)
    assert flow_matching_loss(pred.bfloat16(), x0, noise).dtype == torch.float32
    with pytest.raises(ValueError, match=r"pred: shape \(4, 3\) differs from x0 \(4, 3, 6\)"):
        flow_matching_loss(pred[..., 0], x0, noise)


def test_euler_is_exact_on_the_straight_path_field():
    """Oracle: for v(x, s) = (x - x0) / s (the velocity of the straight path through x0), Euler steps stay
    on the path: x after step i is (1 - s_i) x0 + s_i noise exactly (in exact arithmetic), so x = x0 at s = 0."""
    g = torch.Generator().manual_seed(2)
    x0, noise = torch.randn(2, 7, generator=g, dtype=torch.float64), torch.randn(2, 7, generator=g, dtype=torch.float64)
    sigmas = sampling_sigmas(9, shift=3.0).double()
    seen = []

    def field(x, s):
        seen.append(x)
        return (x - x0) / s.view(-1, 1)

    out = euler_sample(field, noise, sigmas)
    torch.testing.assert_close(out, x0, rtol=0, atol=1e-12)
    for x, s in zip(seen, sigmas[:-1], strict=True):
        torch.testing.assert_close(x, (1 - s) * x0 + s * noise, rtol=0, atol=1e-12)
    const = euler_sample(lambda x, s: noise - x0, noise, sigmas)  # a perfect rectified flow
    torch.testing.assert_close(const, x0, rtol=0, atol=1e-12)


def test_euler_on_a_linear_field_is_the_product_of_its_steps():
    """Oracle: dx/ds = a x gives x_N = prod_i (1 + a (s_{i+1} - s_i)) x_0 under Euler (not exp(-a))."""
    sigmas = sampling_sigmas(8, shift=2.0).double()
    x1 = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    out = euler_sample(lambda x, s: 0.7 * x, x1, sigmas)
    factor = math.prod(1 + 0.7 * float(sigmas[i + 1] - sigmas[i]) for i in range(8))
    torch.testing.assert_close(out, x1 * factor, rtol=1e-12, atol=0)
    assert abs(factor - math.exp(-0.7)) > 1e-3
    s = sampling_sigmas(4)
    torch.testing.assert_close(s, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    with pytest.raises(ValueError, match=r"sigmas: expected a 1-D schedule of >= 2 levels, got shape \(1,\)"):
        euler_sample(lambda x, s: x, x1, torch.ones(1))


def test_loss_node_has_no_parameters_and_lowers_to_the_loss():
    """Oracle: flow_matching_loss with loss_weight applied by hand."""
    node = FlowMatchingLoss(name="loss", dim=6, weighting="cosmap")
    assert node.param_shapes() == {} and node.forward_flops(4, 100) == 0 and node.in_dim == 6
    module = lower_node(node)
    assert module.lf_node is node
    g = torch.Generator().manual_seed(7)
    pred, x0, noise = (torch.randn(3, 5, 6, generator=g) for _ in range(3))
    sigma = torch.tensor([0.1, 0.5, 0.8])
    torch.testing.assert_close(module(pred, x0, noise, sigma),
                               flow_matching_loss(pred, x0, noise, loss_weight(sigma, "cosmap")))
    with pytest.raises(ValueError, match="weighting 'cosmap' needs sigma"):
        module(pred, x0, noise)
    with pytest.raises(IRError, match=r"node 'loss' \(FlowMatchingLoss\): weighting must be"):
        FlowMatchingLoss(name="loss", dim=6, weighting="snr")
    with pytest.raises(IRError, match=r"node 'loss'.*dim must be a positive integer, got 0"):
        FlowMatchingLoss(name="loss", dim=0)
