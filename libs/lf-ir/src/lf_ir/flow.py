"""Rectified flow / flow matching: noising, sigma sampling, the velocity loss and an Euler sampler.

Convention (SD3, Wan2.1, diffusers ``FlowMatchEulerDiscreteScheduler``): a clean sample
``x0`` and Gaussian ``noise`` are joined by the straight path

    x_t = (1 - sigma) * x0 + sigma * noise,      sigma in [0, 1] (1 = pure noise),

whose velocity ``d x_t / d sigma = noise - x0`` is the regression target
(flow matching, Lipman et al. 2022, arXiv 2210.02747; rectified flow, Liu et al.
2022, arXiv 2209.03003; Esser et al. 2024, "Scaling Rectified Flow Transformers",
arXiv 2403.03206). Training samples sigma from a uniform or logit-normal base
distribution and shifts it towards noise, ``sigma' = shift * sigma / (1 + (shift - 1)
* sigma)`` (SD3 section 5.3.2); the network sees ``t = sigma * num_train_timesteps``.
Sampling integrates ``dx/dsigma = v(x, sigma)`` from sigma = 1 to 0 with Euler steps.

All math is float32 (float64 inputs stay float64). Shared by the ``wan_dit`` recipe
and flow-matching action experts. Importing this module registers the lowering of
:class:`FlowMatchingLoss`.

Legend: ``x`` any shape ``(batch, ...)``; ``sigma_b`` (batch,).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from lf_ir._lower import register_lowering
from lf_ir._nodes_flow import FlowMatchingLoss

__all__ = ["FlowMatchingLoss", "FlowMatchingLossModule", "euler_sample", "flow_matching_loss", "interpolate",
           "loss_weight", "sample_sigmas", "sampling_sigmas", "shift_sigma", "timesteps_from_sigmas",
           "velocity_target"]

Weighting = Literal["none", "sigma_sqrt", "cosmap"]


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _per_sample(sigma_b: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(batch,) -> (batch, 1, ..., 1) broadcastable against ``like``; ValueError on a batch mismatch."""
    sigma_b = torch.as_tensor(sigma_b, device=like.device)
    if sigma_b.dim() != 1 or sigma_b.shape[0] != like.shape[0]:
        raise ValueError(f"sigma: expected shape ({like.shape[0]},) (one per sample), got {tuple(sigma_b.shape)}")
    return _f32(sigma_b).view(-1, *([1] * (like.dim() - 1)))


def shift_sigma(sigma: torch.Tensor | float, shift: float) -> torch.Tensor | float:
    """``shift * sigma / (1 + (shift - 1) * sigma)`` (SD3 eq. 23; Wan uses shift 3-5 at 480p/720p).

    Maps [0, 1] onto itself monotonically; shift > 1 moves mass towards noise.

    Raises:
        ValueError: ``shift`` not positive.

    Example:
        >>> shift_sigma(0.5, 3.0)
        0.75
    """
    if not shift > 0:
        raise ValueError(f"shift must be positive, got {shift!r}")
    return shift * sigma / (1 + (shift - 1) * sigma)


def sample_sigmas(batch: int, *, distribution: Literal["uniform", "logit_normal"] = "uniform",
                  shift: float = 1.0, logit_mean: float = 0.0, logit_std: float = 1.0,
                  generator: torch.Generator | None = None, device: torch.device | str | None = None
                  ) -> torch.Tensor:
    """Training noise levels sigma (batch,) float32 in [0, 1], shifted by ``shift``.

    ``"uniform"``: U(0, 1); ``"logit_normal"``: sigmoid(N(logit_mean, logit_std^2))
    (SD3 section 3.1, draws as diffusers' ``compute_density_for_timestep_sampling``).

    Raises:
        ValueError: unknown distribution, ``batch`` < 1, ``logit_std`` or ``shift`` not positive.
    """
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    if distribution == "uniform":
        u = torch.rand(batch, generator=generator, device=device)
    elif distribution == "logit_normal":
        if not logit_std > 0:
            raise ValueError(f"logit_std must be positive, got {logit_std!r}")
        u = torch.sigmoid(torch.normal(logit_mean, logit_std, size=(batch,), generator=generator, device=device))
    else:
        raise ValueError(f"distribution must be 'uniform' or 'logit_normal', got {distribution!r}")
    return shift_sigma(u, shift)


def timesteps_from_sigmas(sigma_b: torch.Tensor, num_train_timesteps: int = 1000) -> torch.Tensor:
    """The network's time input ``t = sigma * num_train_timesteps`` (diffusers' flow-match convention)."""
    return _f32(sigma_b) * num_train_timesteps


def interpolate(x0: torch.Tensor, noise: torch.Tensor, sigma_b: torch.Tensor) -> torch.Tensor:
    """``x_t = (1 - sigma) * x0 + sigma * noise`` per sample, in float32; shapes (batch, ...).

    Raises:
        ValueError: ``x0`` and ``noise`` differ in shape, or sigma is not (batch,).
    """
    if x0.shape != noise.shape:
        raise ValueError(f"noise: shape {tuple(noise.shape)} differs from x0 {tuple(x0.shape)}")
    s = _per_sample(sigma_b, x0)
    return (1 - s) * _f32(x0) + s * _f32(noise)


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The regression target ``noise - x0`` (d x_t / d sigma), float32."""
    return _f32(noise) - _f32(x0)


def loss_weight(sigma_b: torch.Tensor, weighting: Weighting = "none") -> torch.Tensor:
    """Per-sample loss weights (batch,) float32 (SD3's schemes, as diffusers' ``compute_loss_weighting_for_sd3``).

    ``"none"``: 1; ``"sigma_sqrt"``: sigma^-2; ``"cosmap"``: 2 / (pi (1 - 2 sigma + 2 sigma^2)).

    Raises:
        ValueError: unknown scheme.
    """
    sigma_b = _f32(torch.as_tensor(sigma_b))
    if weighting == "none":
        return torch.ones_like(sigma_b)
    if weighting == "sigma_sqrt":
        return sigma_b ** -2.0
    if weighting == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigma_b + 2 * sigma_b ** 2))
    raise ValueError(f"weighting must be 'none', 'sigma_sqrt' or 'cosmap', got {weighting!r}")


def flow_matching_loss(pred: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor,
                       weight_b: torch.Tensor | None = None, *, per_sample: bool = False) -> torch.Tensor:
    """Velocity MSE: ``mean_b w_b * mean_{...}((pred - (noise - x0))^2)`` in float32.

    Args:
        pred: predicted velocity (batch, ...), any float dtype.
        x0, noise: clean sample and noise, same shape as ``pred``.
        weight_b: optional per-sample weights (batch,) (e.g. :func:`loss_weight`).
        per_sample: return the weighted per-sample losses (batch,) instead of their mean.

    Returns:
        A float32 scalar (or (batch,) with ``per_sample``).

    Raises:
        ValueError: shapes differ, or ``weight_b`` is not (batch,).
    """
    if pred.shape != x0.shape:
        raise ValueError(f"pred: shape {tuple(pred.shape)} differs from x0 {tuple(x0.shape)}")
    err = (_f32(pred) - velocity_target(x0, noise)).square()
    loss_b = err.reshape(err.shape[0], -1).mean(dim=1)
    if weight_b is not None:
        loss_b = loss_b * _per_sample(weight_b, loss_b)
    return loss_b if per_sample else loss_b.mean()


def sampling_sigmas(steps: int, shift: float = 1.0, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Inference schedule (steps + 1,) float32 from 1 to 0: ``shift_sigma(linspace(1, 0, steps + 1))``.

    Raises:
        ValueError: ``steps`` < 1 or ``shift`` not positive.
    """
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    return shift_sigma(torch.linspace(1.0, 0.0, steps + 1, device=device), shift)


def euler_sample(velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor,
                 sigmas: torch.Tensor) -> torch.Tensor:
    """Integrate ``dx/dsigma = velocity(x, sigma_b)`` from ``sigmas[0]`` to ``sigmas[-1]`` with Euler steps.

    ``x_{i+1} = x_i + (sigmas[i+1] - sigmas[i]) * velocity(x_i, sigmas[i])`` (Liu et al.
    2022; diffusers ``FlowMatchEulerDiscreteScheduler.step``); ``velocity`` receives
    sigma as a (batch,) tensor. Exact for any field that is constant along straight
    paths (a perfect rectified flow).

    Args:
        velocity: the model, ``(x (batch, ...), sigma (batch,)) -> (batch, ...)``.
        noise: starting point x at ``sigmas[0]`` (usually 1), (batch, ...).
        sigmas: 1-D schedule, e.g. :func:`sampling_sigmas`.

    Returns:
        x at ``sigmas[-1]`` in float32 (float64 for float64 noise).

    Raises:
        ValueError: ``sigmas`` not 1-D with at least 2 entries.
    """
    if sigmas.dim() != 1 or sigmas.shape[0] < 2:
        raise ValueError(f"sigmas: expected a 1-D schedule of >= 2 levels, got shape {tuple(sigmas.shape)}")
    x = _f32(noise)
    sigmas = sigmas.to(device=x.device, dtype=x.dtype)
    for i in range(sigmas.shape[0] - 1):
        sigma_b = sigmas[i].expand(x.shape[0])
        x = x + (sigmas[i + 1] - sigmas[i]) * _f32(velocity(x, sigma_b))
    return x


class FlowMatchingLossModule(nn.Module):
    """The lowered :class:`FlowMatchingLoss`: ``(pred, x0, noise, sigma_b) -> scalar`` float32."""

    def __init__(self, node: FlowMatchingLoss):
        super().__init__()
        self.weighting = node.weighting

    def forward(self, pred: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor,
                sigma_b: torch.Tensor | None = None) -> torch.Tensor:
        weight = None
        if self.weighting != "none":
            if sigma_b is None:
                raise ValueError(f"flow-matching loss with weighting {self.weighting!r} needs sigma")
            weight = loss_weight(sigma_b.to(pred.device), self.weighting)
        return flow_matching_loss(pred, x0, noise, weight)


register_lowering(FlowMatchingLoss)(FlowMatchingLossModule)
