"""Synthetic video latents (``video.latents = "synthetic"``): throughput and memory runs at any clip size.

Why: the long-video target (385 frames at 480x832, issue 10) cannot come from the
Meta-World pipeline in useful time: its renderer gives square frames of
``data.image_size`` (the episodes also stop at ``data.max_steps``, 500 at most in
Meta-World), and the cached-latent path encodes every clip once with the Wan VAE
on the host before training (a 385x480x832 clip through the full VAE on a CPU is
hours per clip). What a long-context *training step* needs is latents of the right
shape; their values do not change its time or memory. So this source draws
N(0, 1) latents of the shape the Wan VAE gives for a ``video.frames`` x
``video.height`` x ``video.width`` clip, deterministically per clip index (seed:
run seed and index), generated when a batch needs them (nothing cached: one
385x480x832 clip is 38.7 MB of float32 latents). The text states are those of the
``data.tasks`` instructions (clip ``i`` gets task ``i % len(tasks)``).

These runs measure speed and memory and check that the run works end to end; the
loss regresses onto noise and means nothing (the run log and ``plan.json`` say
``synthetic latents``). Real long clips come from ``video.latents = "vae"`` with a
dataset whose episodes are long enough, or latents cached by another pipeline.

Legend: latents ``(clips, z, latent frames, h, w)``.
"""

from __future__ import annotations

import zlib

import torch


class SyntheticLatents:
    """Indexable like the cached latents tensor: ``latents[idx]`` -> (len(idx), z, f, h, w) float32, same values
    for the same index on every rank and every run with the same seed.

    Example:
        >>> lat = SyntheticLatents(4, (2, 3, 4, 4), seed=0)
        >>> lat[torch.tensor([1, 3])].shape, bool((lat[:2][1] == lat[torch.tensor([1])][0]).all())
        (torch.Size([2, 2, 3, 4, 4]), True)
    """

    def __init__(self, clips: int, clip_shape: tuple[int, int, int, int], seed: int):
        self.shape = torch.Size((clips, *clip_shape))
        self.seed = seed

    def __len__(self) -> int:
        return self.shape[0]

    def clip(self, index: int) -> torch.Tensor:
        """Clip ``index``'s latents (z, f, h, w) float32, N(0, 1)."""
        gen = torch.Generator().manual_seed(zlib.crc32(f"synthetic:{self.seed}:{index}".encode()) & 0x7FFFFFFF)
        return torch.randn(self.shape[1:], generator=gen)

    def __getitem__(self, idx) -> torch.Tensor:
        indices = range(self.shape[0])[idx] if isinstance(idx, slice) else torch.as_tensor(idx).reshape(-1).tolist()
        return torch.stack([self.clip(int(i)) for i in indices])


def synthetic_shape(cfg) -> tuple[int, int, int, int]:
    """(z, latent frames, h, w) of a ``video.frames`` x ``video.height`` x ``video.width`` clip under the VAE of
    ``video.vae_size`` (``lf_ir.recipes.wan_vae.latent_shape``)."""
    from lf_ir.recipes.wan_vae import latent_shape, wan_vae_config

    v = cfg.video
    vae = wan_vae_config(v.vae_size)
    return (vae.z_dim, *latent_shape(vae, v.frames, v.height, v.width))


def synthetic_data(cfg) -> tuple[SyntheticLatents, torch.Tensor, list[str]]:
    """(latents, task index per clip (clips,) int64, instructions of ``data.tasks``) of a synthetic run."""
    from lf_data import METAWORLD_INSTRUCTIONS

    v, tasks = cfg.video, cfg.data.tasks
    latents = SyntheticLatents(v.synthetic_clips, synthetic_shape(cfg), cfg.run.seed)
    instructions = [METAWORLD_INSTRUCTIONS.get(t, t) for t in tasks]
    return latents, torch.arange(v.synthetic_clips) % len(tasks), instructions
