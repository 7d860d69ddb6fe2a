"""The ``video_vae`` family: train lf-ir's Wan causal 3D VAE (``model.recipe = "wan_vae"``) on Meta-World clips.

Samples: ``video.frames`` (4k + 1) consecutive frames of one training episode, starting every
``video.clip_stride`` frames, at ``data.image_size``, scaled to [-1, 1]; every
``round(1 / vae.eval_fraction)``-th episode is held out for the evaluation. The frames of the dataset are
decoded once into memory (uint8).

Loss per clip, as the Wan 2.1 VAE is trained without its GAN stage (Wan Team, arXiv 2503.20314, section
3.1.2: L1 reconstruction + KL; LTX-Video, arXiv 2501.00103, the same pair):
``mean|x - decode(z)| + vae.kl_weight * mean KL(N(mu, sigma^2) || N(0, 1))`` with ``z = mu + sigma * eps``
(reparameterization; ``eps`` seeded per (run seed, step, clip)), the means taken over the clip's pixels and
latent elements; the decoder output is not clamped in training (a clamp would stop the gradient of
saturated pixels). Summed over clips (normalizer: clips).

Evaluation (the first ``vae.eval_clips`` held-out clips, posterior mean, clamped decode): ``eval/l1``,
``eval/psnr`` (dB, pixels in [-1, 1] so the peak-to-peak range is 2) and ``eval/kl``.

A trained run folder is what the video family's ``video.vae_weights`` takes
(:mod:`lf_orchestrator.families._vae_run`): the DiT run encodes its clips with this VAE.

Legend: ``video_bcthw`` (batch, 3, frames, H, W) in [-1, 1]; ``mean_bcthw`` / ``logvar_bcthw`` (batch, z_dim,
latent frames, H / 8, W / 8).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from lf_orchestrator.families._metaworld import open_dataset, split_episodes
from lf_orchestrator.families.base import Family, sample_seed


def _wan_vae_class():
    from lf_ir.recipes.wan_vae import WanVAE

    class TrainableWanVAE(WanVAE):
        """lf-ir's :class:`~lf_ir.recipes.wan_vae.WanVAE` (same parameter names) with the training pass."""

        @property
        def blocks(self) -> list[nn.Module]:
            """The resolution stages, encoder then decoder (what the trainer's activation recomputation wraps;
            only ``"none"`` / ``"full"`` make sense for them)."""
            return [*self.encoder, *self.decoder]

        def reconstruct(self, video_bcthw: torch.Tensor, eps_bcthw: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """(unclamped reconstruction of a sampled latent, latent mean, latent log-variance); whole clips."""
            mean, logvar = self.encode(video_bcthw, mode="full")
            z = mean + torch.exp(0.5 * logvar) * eps_bcthw.to(mean.dtype)
            return self._run(self.decoder, z, None), mean, logvar

    return TrainableWanVAE


def kl_per_sample(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Mean over latent elements of KL(N(mean, exp(logvar)) || N(0, 1)) per sample: (batch,) float32."""
    m, lv = mean.float(), logvar.float()
    return (0.5 * (m * m + lv.exp() - 1.0 - lv)).flatten(1).mean(1)


class VideoVAEFamily(Family):
    """wan_vae on Meta-World clips (see the module docstring)."""

    name = "video_vae"
    loss_label = "L1 + kl_weight * KL"

    def __init__(self, cfg, run_dir, ctx):
        super().__init__(cfg, run_dir, ctx)
        from lf_ir.recipes.wan_vae import build_graph

        side = cfg.data.image_size
        self.graph = build_graph(self.recipe_cfg, cfg.video.frames, side, side)  # costs of this clip size

    def prepare(self) -> None:
        v = self.cfg.video
        dataset = open_dataset(self.cfg, generate=self.ctx.is_main)
        self.frames_nhwc = torch.from_numpy(np.stack([np.asarray(dataset.image(i)) for i in range(len(dataset))]))
        side = self.cfg.data.image_size
        if tuple(self.frames_nhwc.shape[1:3]) != (side, side):
            raise ValueError(f"data.image_size: the dataset {dataset.root} has {self.frames_nhwc.shape[1]} x "
                             f"{self.frames_nhwc.shape[2]} frames, the config says {side} x {side} (the VAE is "
                             f"sized for it); set data.image_size = {self.frames_nhwc.shape[1]}")
        train, held = split_episodes(len(dataset.episode_ranges), self.cfg.vae.eval_fraction)

        def starts(episodes: list[int]) -> list[int]:
            return [s for e in episodes for s in range(dataset.episode_ranges[e][0],
                                                       dataset.episode_ranges[e][1] - v.frames + 1, v.clip_stride)]

        self.train_starts, self.eval_starts = starts(train), starts(held or train)
        if not self.train_starts:
            raise ValueError(f"video.frames: no training episode of {dataset.root} has {v.frames} frames")

    @property
    def num_samples(self) -> int:
        return len(self.train_starts)

    @property
    def seq_len(self) -> int:
        """Input voxels per clip (frames x height x width): the ``seq_len`` of the graph's first encoder level,
        its main component for the plan search."""
        return self.graph.components[0].seq_len

    def build_model(self, device: torch.device) -> nn.Module:
        """The Wan VAE of ``model.size`` / ``model.overrides`` on ``device`` (lf-ir's init, seed ``run.seed``)."""
        from lf_ir import materialize

        with torch.device("meta"):
            model = _wan_vae_class()(self.recipe_cfg, self.graph)
        return materialize(model, device, self.cfg.run.seed)

    def clips(self, starts: list[int]) -> torch.Tensor:
        """Clips starting at the given frames: (len(starts), 3, video.frames, H, W) float32 in [-1, 1]."""
        idx = torch.tensor(starts)[:, None] + torch.arange(self.cfg.video.frames)
        return self.frames_nhwc[idx].permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0

    def _latent_noise(self, n: int, gen: torch.Generator) -> torch.Tensor:
        from lf_ir.recipes.wan_vae import latent_shape

        side = self.cfg.data.image_size
        return torch.randn(n, self.recipe_cfg.z_dim, *latent_shape(self.recipe_cfg, self.cfg.video.frames, side, side),
                           generator=gen)

    def collate(self, indices: list[int], step: int) -> dict[str, torch.Tensor]:
        eps = [self._latent_noise(1, torch.Generator().manual_seed(sample_seed(self.cfg.run.seed, step, i)))
               for i in indices]
        return {"video": self.clips([self.train_starts[i] for i in indices]), "eps": torch.cat(eps)}

    def normalizer(self, batch) -> int:
        return int(batch["video"].shape[0])

    def loss_sum(self, model, batch):
        """Summed per-clip ``L1 + kl_weight * KL``; metrics ``l1`` and ``kl`` (sums over clips)."""
        recon, mean, logvar = model.reconstruct(batch["video"], batch["eps"])
        l1 = (recon.float() - batch["video"].float()).abs().flatten(1).mean(1)
        kl = kl_per_sample(mean, logvar)
        return (l1 + self.cfg.vae.kl_weight * kl).sum(), {"l1": l1.detach().sum(), "kl": kl.detach().sum()}

    def evaluate(self, model) -> dict[str, float]:
        """L1, PSNR (dB) and KL of the posterior-mean reconstruction of the first held-out clips."""
        device = next(model.parameters()).device
        starts = self.eval_starts[:self.cfg.vae.eval_clips]
        l1 = sq = kl = 0.0
        for i in range(0, len(starts), 4):
            video = self.clips(starts[i:i + 4]).to(device)
            mean, logvar = model.encode(video, mode="full")
            err = model.decode(mean, mode="full").float() - video
            l1 += float(err.abs().flatten(1).mean(1).sum())
            sq += float(err.square().flatten(1).mean(1).sum())
            kl += float(kl_per_sample(mean, logvar).sum())
        n = len(starts)
        return {"eval/l1": l1 / n, "eval/psnr": 10 * math.log10(4.0 / max(sq / n, 1e-12)), "eval/kl": kl / n}


def make_family(cfg, run_dir, ctx) -> VideoVAEFamily:
    """The family object of ``model.recipe = "wan_vae"``."""
    return VideoVAEFamily(cfg, run_dir, ctx)
