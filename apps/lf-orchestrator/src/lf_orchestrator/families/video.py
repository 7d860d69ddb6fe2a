"""The ``video`` family: Wan DiT text-to-video by rectified flow on cached VAE latents of Meta-World clips
(or, for throughput runs, synthetic latents of any clip size: ``video.latents = "synthetic"``,
:mod:`._video_synthetic`).

Per training sample (deterministic per (run seed, step, clip index): any split,
any resume draws the same): sigma from ``lf_ir.flow.sample_sigmas`` (uniform or
logit-normal, shifted by ``video.shift``), Gaussian noise, and with probability
``video.cfg_dropout`` the null (zero) text states instead of the instruction's
(classifier-free guidance, Ho & Salimans 2022). Loss: the velocity MSE of
``lf_ir.flow.flow_matching_loss`` per sample, summed (normalizer: samples).
Evaluation: the same loss on the first clips at fixed sigmas (0.25, 0.5, 0.75)
and fixed noise. Data and text encoder: :mod:`._video_data`. With ``video.vae_weights`` naming a
``wan_vae`` run folder the clips are encoded by that trained VAE and the run folder gets its
``vae.safetensors`` for ``lf sample`` (:mod:`._vae_run`).

Legend: ``x0_bcfhw`` (batch, z, latent frames, h, w); ``text_bld`` (batch, text_len, text_dim).
"""

from __future__ import annotations

import math

import torch

from lf_ir.flow import flow_matching_loss, interpolate, sample_sigmas, timesteps_from_sigmas
from lf_orchestrator.families._context import cp_all_sum, video_loss_share
from lf_orchestrator.families._metaworld import open_dataset
from lf_orchestrator.families._vae_run import VAE_FILE, is_vae_run, save_vae_file, with_stats
from lf_orchestrator.families._video_data import (
    build_vae,
    encode_clips,
    encode_text,
    save_text_encoder,
    save_trained_instructions,
    text_table,
)
from lf_orchestrator.families.base import Family, sample_seed

EVAL_SIGMAS = (0.25, 0.5, 0.75)
"""Noise levels of the evaluation loss."""


def velocity_loss_sum(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum over samples of the per-sample velocity MSE (float32)."""
    sigma_b = batch["sigma"]
    x_t = interpolate(batch["x0"], batch["noise"], sigma_b).to(batch["x0"].dtype)
    pred = model(x_t, timesteps_from_sigmas(sigma_b), batch["text"])
    return flow_matching_loss(pred, batch["x0"], batch["noise"], per_sample=True).sum()


class VideoFamily(Family):
    """wan_dit on Meta-World clip latents (see the module docstring)."""

    name = "video"
    loss_label = "velocity MSE"
    context_parallel = True

    def prepare(self) -> None:
        from lf_data import build_instruction_tokenizer

        rc = self.recipe_cfg
        if self.cfg.video.latents == "synthetic":  # throughput runs: no dataset, no VAE (._video_synthetic)
            from lf_orchestrator.families._video_synthetic import synthetic_data

            self.latents, self.task_index, tasks = synthetic_data(self.cfg)
            self.data_note = (f"synthetic latents {tuple(self.latents.shape[1:])} per clip (throughput / memory run: "
                              "the loss regresses onto noise and means nothing)")
        else:
            dataset = open_dataset(self.cfg, generate=self.ctx.is_main)
            gpu = self.ctx.device.type == "cuda"
            tensors = encode_clips(self.cfg, dataset, batch=32 if gpu else 4, device=self.ctx.device)
            self.latents, self.task_index, tasks = tensors["latents"], tensors["task_index"].long(), dataset.tasks
            if self.ctx.is_main and is_vae_run(self.cfg.video.vae_weights):  # `lf sample` decodes with this file
                vae = with_stats(build_vae(self.cfg.video), tuple(tensors["latents_mean"].tolist()),
                                 tuple(tensors["latents_std"].tolist()))
                save_vae_file(self.run_dir / VAE_FILE, vae)
        self.tok = build_instruction_tokenizer(tasks)
        table = text_table(self.tok.get_vocab_size(), rc.text_dim, self.cfg.run.seed)
        self.text_states = encode_text(self.tok, table, tasks, rc.text_len)
        if self.ctx.is_main:
            save_text_encoder(self.run_dir, self.tok, table)
            save_trained_instructions(self.run_dir, [tasks[i] for i in self.task_index.unique().tolist()])

    @property
    def num_samples(self) -> int:
        return int(self.latents.shape[0])

    @property
    def seq_len(self) -> int:
        return math.prod(s // p for s, p in zip(self.latents.shape[2:], self.recipe_cfg.patch, strict=True))

    def collate(self, indices: list[int], step: int) -> dict[str, torch.Tensor]:
        v = self.cfg.video
        sigmas, noises, texts = [], [], []
        for i in indices:
            gen = torch.Generator().manual_seed(sample_seed(self.cfg.run.seed, step, i))
            sigmas.append(sample_sigmas(1, distribution=v.sigma_distribution, shift=v.shift, generator=gen))
            noises.append(torch.randn(self.latents.shape[1:], generator=gen))
            drop = float(torch.rand(1, generator=gen)) < v.cfg_dropout
            text = self.text_states[self.task_index[i]]
            texts.append(torch.zeros_like(text) if drop else text)
        idx = torch.tensor(indices)
        return {"x0": self.latents[idx], "noise": torch.stack(noises), "sigma": torch.cat(sigmas),
                "text": torch.stack(texts)}

    def normalizer(self, batch) -> int:
        return int(batch["x0"].shape[0])

    def loss_sum(self, model, batch, cp=None):
        """Summed velocity MSE; with ``cp`` this rank's share (:func:`._context.video_loss_share`)."""
        if cp is not None:
            return video_loss_share(model, batch, cp), {}
        return velocity_loss_sum(model, batch), {}

    def evaluate(self, model, cp=None) -> dict[str, float]:
        """Velocity MSE of the first (up to 8) clips at sigmas :data:`EVAL_SIGMAS`, fixed noise (seed 0); with
        ``cp`` the cp ranks' shares summed over the cp group."""
        device = next(model.parameters()).device
        n = min(8, self.num_samples)
        gen = torch.Generator().manual_seed(0)
        noise = torch.randn((n, *self.latents.shape[1:]), generator=gen)
        total = 0.0
        for s in EVAL_SIGMAS:
            batch = {"x0": self.latents[:n], "noise": noise, "sigma": torch.full((n,), s),
                     "text": self.text_states[self.task_index[:n]]}
            batch = {k: t.to(device) for k, t in batch.items()}
            total += float(velocity_loss_sum(model, batch) if cp is None
                           else cp_all_sum(video_loss_share(model, batch, cp), cp))
        return {"eval/flow_loss": total / (n * len(EVAL_SIGMAS))}


def make_family(cfg, run_dir, ctx) -> VideoFamily:
    """The family object of ``model.recipe = "wan_dit"``."""
    return VideoFamily(cfg, run_dir, ctx)
