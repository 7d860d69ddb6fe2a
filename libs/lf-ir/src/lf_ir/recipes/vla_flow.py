"""Flow-matching VLA recipe (pi0): a VLM prefix and an action expert that predicts a velocity field.

Follows Black et al. 2024, "pi0: A Vision-Language-Action Flow Model for General
Robot Control" (arXiv 2410.24164), with a single camera and a learned-position
ViT/transformer instead of PaliGemma. Sequence per sample and who attends to whom:

    [ image patches | instruction tokens (padded) | state ] [ H noisy action tokens ]
      <------------- prefix: backbone weights ------------>   <- action-expert weights ->
      prefix sees the prefix (bidirectional)                   suffix sees everything

Every backbone layer is a :class:`~lf_ir._nodes_expert.JointAttentionBlock`: the
prefix runs through the backbone's weights, the suffix through the expert's
(narrower width and MLP; same layers, heads and head_dim so their keys and values
concatenate). The suffix input is pi0's action/time MLP on the noisy action chunk
and a sine-cosine embedding of the flow time; the output is a velocity (batch, H,
action_dim) in normalized action units.

Training (:meth:`VLAFlowModel.training_loss`): ``x_t = (1 - sigma) a + sigma eps`` and
the velocity target ``eps - a`` of :mod:`lf_ir.flow`, loss :func:`lf_ir.flow.flow_matching_loss`
on the real (non-padded) action steps. Flow time: pi0's ``Beta(1.5, 1)`` scaled to
``[0.001, 1]`` (openpi: ``sigma = 0.999 * Beta(1.5, 1) + 0.001``, drawn as ``u^(1/1.5)``
by the inverse CDF; ``sigma = 1`` is pure noise, so the density ``~ sigma^0.5`` favours
noisy times as the paper's ``p(tau)`` does); ``time_distribution = "uniform"`` or
``"logit_normal"`` (SD3) are the alternatives. Sampling (:meth:`VLAFlowModel.sample_actions`):
Euler integration (:func:`lf_ir.flow.euler_sample`) from noise at sigma = 1 to 0 in
``sample_steps`` (10) equal steps, the prefix's keys and values computed once and
reused at every step.

Batches (:meth:`VLAFlowModel.training_loss`): ``image`` uint8 (n, H_img, W_img, 3),
``instruction_ids`` int64 / ``instruction_mask`` bool (n, max_instruction_len),
``state`` float (n, state_dim) normalized, ``actions`` float (n, H, action_dim)
normalized, ``action_mask`` bool (n, H) True = a real step; optionally ``noise`` (n, H,
action_dim) and ``sigma`` (n,), or ``sample_seed`` int64 (n,) to draw them per sample.

Legend: ``x_bsd`` (batch, seq, width); actions ``_bha`` (batch, H, action_dim).

Example:
    >>> cfg = vla_flow_config("tiny", image_size=32, patch_size=8)
    >>> build_graph(cfg).component("backbone").seq_len == cfg.prefix_len + cfg.action_horizon
    True
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from lf_ir import flow
from lf_ir._graph import Graph
from lf_ir._lower import ComponentModule
from lf_ir._lower_expert import JointBlockModule
from lf_ir.recipes._spec import RecipeSpec, register_recipe
from lf_ir.recipes._vla_flow_graph import SIZES, TimeDistribution, VLAFlowConfig, build_graph, vla_flow_config
from lf_kernels import MaskSpec

__all__ = ["SIZES", "SPEC", "TimeDistribution", "VLAFlowConfig", "VLAFlowModel", "build_graph", "draw_flow_noise",
           "sample_seeds", "vla_flow_config"]

BETA_ALPHA, SIGMA_MIN = 1.5, 0.001
"""pi0's flow-time distribution: ``sigma = (1 - SIGMA_MIN) * Beta(BETA_ALPHA, 1) + SIGMA_MIN``."""


def sample_seeds(run_seed: int, step: int, indices: Sequence[int]) -> torch.Tensor:
    """Per-sample noise seeds (n,) int64 from (run seed, step, dataset index), independent of the process layout."""
    return torch.tensor([zlib.crc32(f"{run_seed}:{step}:{i}".encode()) for i in indices], dtype=torch.int64)


def draw_flow_noise(n: int, horizon: int, action_dim: int, distribution: TimeDistribution = "beta", *,
                    seeds: torch.Tensor | None = None, generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian noise (n, horizon, action_dim) and flow times sigma (n,) in [0, 1], float32 on the CPU.

    With ``seeds`` (n,) int64 each sample draws from its own generator (the same
    sample and seed give the same draw however the batch is split across processes
    or micro-batches); otherwise from ``generator`` (or the global CPU generator).

    Raises:
        ValueError: unknown distribution or a ``seeds`` length other than ``n``.
    """
    if distribution not in ("beta", "uniform", "logit_normal"):
        raise ValueError(f"time_distribution must be 'beta', 'uniform' or 'logit_normal', got {distribution!r}")
    if seeds is None:
        noise = torch.randn(n, horizon, action_dim, generator=generator)
        u, z = torch.rand(n, generator=generator), torch.randn(n, generator=generator)
    else:
        if seeds.shape != (n,):
            raise ValueError(f"sample_seed: expected shape ({n},), got {tuple(seeds.shape)}")
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds.tolist()]
        noise = torch.stack([torch.randn(horizon, action_dim, generator=g) for g in gens])
        u = torch.cat([torch.rand(1, generator=g) for g in gens])
        z = torch.cat([torch.randn(1, generator=g) for g in gens])
    if distribution == "beta":
        sigma = (1 - SIGMA_MIN) * u ** (1 / BETA_ALPHA) + SIGMA_MIN
    elif distribution == "uniform":
        sigma = u
    else:
        sigma = torch.sigmoid(z)
    return noise, sigma


class VLAFlowModel(nn.Module):
    """The lowered flow-matching VLA. Build under ``torch.device("meta")`` and materialize with lf_ir.materialize.

    Example:
        >>> from lf_ir import materialize
        >>> cfg = vla_flow_config("tiny", image_size=32, patch_size=8, max_instruction_len=4)
        >>> with torch.device("meta"):
        ...     model = VLAFlowModel(cfg)
        >>> model = materialize(model, "cpu", 0)
        >>> obs = dict(image=torch.zeros(1, 32, 32, 3, dtype=torch.uint8), instruction_ids=torch.ones(1, 4).long(),
        ...            instruction_mask=torch.ones(1, 4, dtype=torch.bool), state=torch.zeros(1, 39))
        >>> model.sample_actions(**obs).shape
        torch.Size([1, 4, 4])
    """

    def __init__(self, cfg: VLAFlowConfig, graph: Graph | None = None):
        super().__init__()
        self.cfg = cfg
        self.graph = graph if graph is not None else build_graph(cfg)
        self.components = nn.ModuleDict({c.name: ComponentModule(c) for c in self.graph.components})

    @property
    def joint_blocks(self) -> list[JointBlockModule]:
        """The backbone's joint-attention layers, in order."""
        return [m for m in self.components["backbone"].layers if isinstance(m, JointBlockModule)]

    @property
    def blocks(self) -> list[nn.Module]:
        """All repeated blocks (vision transformer blocks, then joint layers), for recompute and planning."""
        return [*self.components["vision"].blocks, *self.joint_blocks]

    def _dtype(self) -> torch.dtype:
        return self.components["state"].layers[0].weight.dtype

    def encode_prefix(self, image: torch.Tensor, instruction_ids: torch.Tensor, instruction_mask: torch.Tensor,
                      state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix hidden states (batch, P, dim) with positions added, and its key padding (batch, P) bool.

        image uint8 (batch, H, W, 3); instruction_ids int64 and instruction_mask bool
        (batch, max_instruction_len); state float (batch, state_dim), normalized.

        Raises:
            ValueError: an image of another size.
        """
        cfg, comps = self.cfg, self.components
        if image.shape[1:] != (cfg.image_size, cfg.image_size, 3):
            raise ValueError(f"image: expected (batch, {cfg.image_size}, {cfg.image_size}, 3), "
                             f"got {tuple(image.shape)}")
        pixels = image.permute(0, 3, 1, 2).to(self._dtype()) * (2.0 / 255.0) - 1.0  # uint8 -> [-1, 1]
        vision = comps["vision"](pixels, mask=MaskSpec(kind="full"))
        text = comps["tokens"](instruction_ids)
        state_tok = comps["state"](state.to(vision.dtype)).unsqueeze(1)
        prefix = comps["backbone"]["pos"](torch.cat([vision, text, state_tok], dim=1))
        ones = torch.ones(image.shape[0], vision.shape[1] + 1, dtype=torch.bool, device=image.device)
        padding = torch.cat([ones[:, :-1], instruction_mask.bool(), ones[:, -1:]], dim=1)
        return prefix, padding

    def _suffix_in(self, noisy_bha: torch.Tensor, sigma_b: torch.Tensor) -> torch.Tensor:
        expert = self.components["action_expert"]
        return expert["pos"](expert["embed"](noisy_bha.to(self._dtype()), sigma_b))

    def _velocity(self, x_suf: torch.Tensor) -> torch.Tensor:
        expert = self.components["action_expert"]
        return expert["head"](expert["norm"](x_suf))

    def prefix_cache(self, prefix: torch.Tensor, padding: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values (batch, kv_heads, P, head_dim) of the prefix at every joint layer (the KV cache)."""
        cache = []
        for block in self.joint_blocks:
            prefix, k, v = block.prefix_kv(prefix, padding)
            cache.append((k, v))
        return cache

    def denoise(self, cache: Sequence[tuple[torch.Tensor, torch.Tensor]], padding: torch.Tensor,
                noisy_bha: torch.Tensor, sigma_b: torch.Tensor) -> torch.Tensor:
        """Velocity (batch, H, action_dim) at ``noisy_bha`` and flow time ``sigma_b`` (batch,), from a prefix cache."""
        x_suf = self._suffix_in(noisy_bha, sigma_b)
        for block, (k, v) in zip(self.joint_blocks, cache, strict=True):
            x_suf = block.suffix_step(x_suf, k, v, padding)
        return self._velocity(x_suf)

    def forward(self, image, instruction_ids, instruction_mask, state, noisy_actions, sigma) -> torch.Tensor:
        """Velocity (batch, H, action_dim) for noisy actions (batch, H, action_dim) at times sigma (batch,).

        One pass of both streams through every joint layer (the training path); see
        :meth:`encode_prefix` for the observation inputs.

        Raises:
            ValueError: noisy actions of another shape than (batch, action_horizon, action_dim).
        """
        cfg = self.cfg
        if noisy_actions.shape[1:] != (cfg.action_horizon, cfg.action_dim):
            raise ValueError(f"noisy_actions: expected (batch, {cfg.action_horizon}, {cfg.action_dim}), "
                             f"got {tuple(noisy_actions.shape)}")
        x_pre, padding = self.encode_prefix(image, instruction_ids, instruction_mask, state)
        x_suf = self._suffix_in(noisy_actions, sigma)
        for block in self.joint_blocks:
            x_pre, x_suf = block(x_pre, x_suf, padding)
        return self._velocity(x_suf)

    def loss_normalizer(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Real action values in ``batch`` (non-padded steps times action_dim): what the loss sum is divided by."""
        return batch["action_mask"].sum() * self.cfg.action_dim

    def training_loss(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(sum of squared velocity errors over the real action values, float32 scalar; extra metric sums: none).

        Noise and flow time come from ``batch["noise"]``/``batch["sigma"]``, else are drawn per
        sample from ``batch["sample_seed"]``, else from the global CPU generator
        (:func:`draw_flow_noise`). Divide by :meth:`loss_normalizer` for the mean.
        """
        x0 = batch["actions"]
        n, device = x0.shape[0], x0.device
        if "noise" in batch:
            noise, sigma = batch["noise"], batch["sigma"]
        else:
            noise, sigma = draw_flow_noise(n, self.cfg.action_horizon, self.cfg.action_dim, self.cfg.time_distribution,
                                           seeds=batch.get("sample_seed"))
            noise, sigma = noise.to(device), sigma.to(device)
        x_t = flow.interpolate(x0, noise, sigma)
        pred = self(batch["image"], batch["instruction_ids"], batch["instruction_mask"], batch["state"], x_t, sigma)
        with torch.autocast(device.type, enabled=False):
            pred = pred.to(torch.promote_types(pred.dtype, torch.float32))
            keep = batch["action_mask"].to(pred.dtype)[..., None]  # padded steps contribute 0
            per_sample = flow.flow_matching_loss(pred * keep, x0 * keep, noise * keep, per_sample=True)
            return per_sample.sum() * (x0.shape[1] * x0.shape[2]), {}

    @torch.no_grad()
    def sample_actions(self, image, instruction_ids, instruction_mask, state, *, steps: int | None = None,
                       noise: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalized action chunks (batch, H, action_dim) float32: Euler from Gaussian noise, prefix KV cached.

        ``steps`` defaults to ``cfg.sample_steps``; ``noise`` (batch, H, action_dim) to a draw
        from ``generator`` on the CPU.
        """
        cfg = self.cfg
        prefix, padding = self.encode_prefix(image, instruction_ids, instruction_mask, state)
        cache = self.prefix_cache(prefix, padding)
        if noise is None:
            noise = torch.randn(image.shape[0], cfg.action_horizon, cfg.action_dim, generator=generator)
        sigmas = flow.sampling_sigmas(steps or cfg.sample_steps)
        return flow.euler_sample(lambda x, s: self.denoise(cache, padding, x, s), noise.to(image.device), sigmas)


SPEC = register_recipe(RecipeSpec(
    name="vla_flow", family="vla_flow", config_class=VLAFlowConfig, sizes=SIZES, build_graph=build_graph,
    model=VLAFlowModel, masks=("full",), tensor_parallel=True, sequence_parallel=False))
"""The vla_flow recipe (pi0-style flow matching): pi0's block mask runs as two full-attention calls
(:mod:`lf_ir._lower_expert`). Its vocabulary size comes from the run's fitted tokenizer as an override."""
