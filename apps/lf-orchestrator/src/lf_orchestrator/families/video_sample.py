"""Sampling a trained video-family run: Euler integration of the flow with CFG, VAE decode, mp4.

``v = v_null + g (v_text - v_null)`` (classifier-free guidance) integrated by
``lf_ir.flow.euler_sample`` over ``sampling_sigmas(steps, video.shift)`` from
seeded noise; latents are de-normalized and decoded by the run's Wan VAE (the run folder's
``vae.safetensors`` when the run trained on a ``wan_vae`` run's VAE, :mod:`._vae_run`); the
clip (frames, H, W, 3) uint8 is written by ``lf_data.write_video``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lf_ir.flow import euler_sample, sampling_sigmas, timesteps_from_sigmas
from lf_orchestrator.checkpoint import latest_checkpoint
from lf_orchestrator.families._state import load_model_weights
from lf_orchestrator.families._video_data import build_vae, encode_text, load_text_encoder
from lf_orchestrator.families.lora import apply_lora
from lf_orchestrator.families.recipes import build_model, recipe_config


def load_video_model(cfg, run_dir: Path, device: torch.device | str = "cpu"):
    """The run's DiT with its latest checkpoint's weights (LoRA applied as in training).

    Raises:
        FileNotFoundError: no complete checkpoint in the run folder.
    """
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir}: no complete checkpoint under {Path(run_dir) / 'checkpoints'}")
    rcfg, graph = recipe_config(cfg.model.recipe, cfg.model.size, cfg.model.overrides)
    model = build_model(cfg.model.recipe, rcfg, graph, device, cfg.run.seed, fused_ops=cfg.model.fused_ops)
    if cfg.train.lora_rank > 0:
        apply_lora(model, cfg.train.lora_targets, cfg.train.lora_rank, cfg.train.lora_alpha, seed=cfg.run.seed)
    model.load_state_dict(load_model_weights(ckpt))
    return model.eval()


def sample_video(cfg, run_dir: Path, prompt: str, *, out: Path, frames: int | None = None, steps: int | None = None,
                 guidance: float | None = None, seed: int = 0, fps: int = 10) -> tuple[Path, tuple[int, int, int]]:
    """Generate one clip for ``prompt`` (:func:`sample_clip`) and write it to ``out``; returns (path, (frames,
    height, width)).

    Raises:
        ValueError: ``frames`` not 4k + 1 for the VAE, or steps < 1.
        FileNotFoundError: the run folder lacks its checkpoint or text encoder.
    """
    from lf_data import write_video

    clip = sample_clip(cfg, run_dir, prompt, frames=frames, steps=steps, guidance=guidance, seed=seed)
    path = write_video(out, clip, fps)
    return Path(path), tuple(clip.shape[:3])


def sample_clip(cfg, run_dir: Path, prompt: str, *, frames: int | None = None, steps: int | None = None,
                guidance: float | None = None, seed: int = 0):
    """One generated clip for ``prompt``: uint8 numpy array (frames, height, width, 3), on the CPU.

    Raises:
        ValueError: an empty ``prompt``, ``frames`` not 4k + 1 for the VAE, or steps < 1.
        FileNotFoundError: the run folder lacks its checkpoint or text encoder.
    """
    from lf_ir.recipes.wan_vae import latent_shape

    if not prompt.strip():
        raise ValueError(f"prompt: empty ({prompt!r}); give the text to generate a clip for")
    v = cfg.video
    frames = v.frames if frames is None else frames
    steps = v.sample_steps if steps is None else steps
    if frames < 1:
        raise ValueError(f"--frames must be >= 1 (4k + 1), got {frames}")
    guidance = v.guidance if guidance is None else guidance
    vae = build_vae(v, run_dir=run_dir)  # a trained VAE's file in the run folder first
    lf, lh, lw = latent_shape(vae.cfg, frames, cfg.data.image_size, cfg.data.image_size)
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    model = load_video_model(cfg, run_dir)
    tok, table = load_text_encoder(run_dir)
    text = encode_text(tok, table, [prompt], model.cfg.text_len)
    null = torch.zeros_like(text)

    def velocity(x: torch.Tensor, sigma_b: torch.Tensor) -> torch.Tensor:
        t = timesteps_from_sigmas(sigma_b)
        cond = model(x, t, text)
        if guidance == 1.0:
            return cond
        uncond = model(x, t, null)
        return uncond + guidance * (cond - uncond)

    noise = torch.randn(1, vae.cfg.z_dim, lf, lh, lw, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        latents = euler_sample(velocity, noise, sampling_sigmas(steps, v.shift))
        video = vae.decode(vae.denormalize_latents(latents))[0]  # (3, T, H, W) in [-1, 1]
    return ((video.permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
