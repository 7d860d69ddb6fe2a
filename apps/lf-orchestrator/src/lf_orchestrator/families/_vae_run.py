"""A trained Wan VAE for the video family: a ``wan_vae`` run folder in, one self-contained file out.

``video.vae_weights`` may name the run folder of a ``model.recipe = "wan_vae"`` run
(:mod:`lf_orchestrator.families.video_vae`): its ``config.toml`` gives the VAE config
(``model.size`` + ``model.overrides``), its newest complete checkpoint the weights (either layout,
``lf_orchestrator.checkpoint.load_weights``). Such a VAE has no published latent statistics, so the
video family normalizes with the per-channel mean and standard deviation of the latents of its own
training clips (as Wan's ``latents_mean`` / ``latents_std`` were measured on Wan's data), and writes
the VAE with those statistics into the DiT run folder as :data:`VAE_FILE` (weights + the config as
JSON metadata): ``lf sample`` decodes with that file, so a copied DiT run folder samples alone.

Legend: ``latent_bcthw`` (clips, z_dim, latent frames, h, w).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lf_orchestrator._atomic import atomic_path

VAE_FILE = "vae.safetensors"
"""The DiT run folder's VAE: weights (lf-ir names) + metadata ``{"config": WanVAEConfig as JSON}``."""


def is_vae_run(weights: str) -> bool:
    """Whether ``video.vae_weights`` names a folder (a wan_vae run) rather than a safetensors file."""
    return bool(weights) and Path(weights).is_dir()


def run_vae_config(run_dir: str | Path):
    """``(model.size, WanVAEConfig)`` of a wan_vae run folder, from its ``config.toml``.

    Raises:
        FileNotFoundError: no ``config.toml`` in the folder.
        ValueError: the run is not a ``wan_vae`` run, or its size / overrides do not build (naming them).
    """
    from lf_orchestrator.families.recipes import recipe_config

    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        raise FileNotFoundError(f"video.vae_weights: {run_dir} is not a run folder (no config.toml)")
    model = tomllib.loads(path.read_text()).get("model", {})
    if model.get("recipe") != "wan_vae":
        raise ValueError(f"video.vae_weights: {run_dir} is a model.recipe = {model.get('recipe')!r} run, "
                         "expected a 'wan_vae' run")
    size = model.get("size", "")
    return size, recipe_config("wan_vae", size, model.get("overrides", {}))[0]


def _vae(cfg, device, weights: dict[str, torch.Tensor]):
    from lf_ir import materialize
    from lf_ir.recipes.wan_vae import WanVAE

    with torch.device("meta"):
        vae = WanVAE(cfg)
    vae = materialize(vae, device, seed=0)
    vae.load_state_dict({k: v.float() for k, v in weights.items()})
    return vae.eval().requires_grad_(False)


def load_run_vae(run_dir: str | Path, device: torch.device | str = "cpu"):
    """The wan_vae run's VAE with its newest checkpoint's weights (eval mode, no gradients).

    Raises:
        FileNotFoundError: no config.toml, or no complete checkpoint in the folder.
        ValueError: not a wan_vae run (see :func:`run_vae_config`).
    """
    from lf_orchestrator.checkpoint import latest_checkpoint, load_weights

    _, cfg = run_vae_config(run_dir)
    ckpt = latest_checkpoint(Path(run_dir))
    if ckpt is None:
        raise FileNotFoundError(f"video.vae_weights: {run_dir} has no complete checkpoint under "
                                f"{Path(run_dir) / 'checkpoints'} (train it first: `lf run` of the wan_vae config)")
    return _vae(cfg, device, load_weights(ckpt))


def run_vae_id(run_dir: str | Path) -> str:
    """What identifies the weights of a wan_vae run for the latent cache key: its newest checkpoint and the
    modification times of the checkpoint's files."""
    from lf_orchestrator.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(Path(run_dir))
    if ckpt is None:
        return f"{Path(run_dir).resolve()}:no-checkpoint"
    stamps = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in ckpt.iterdir() if p.is_file())
    return f"{ckpt.resolve()}:{','.join(stamps)}"


def latent_stats(latent_bcthw: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, standard deviation) over clips, frames and pixels of raw latents (float64 sums)."""
    x = latent_bcthw.double().transpose(0, 1).flatten(1)
    return tuple(x.mean(1).tolist()), tuple(x.std(1).clamp(min=1e-6).tolist())


def with_stats(vae, mean: tuple[float, ...], std: tuple[float, ...]):
    """``vae`` normalizing with the given per-channel latent statistics (its config replaced)."""
    vae.cfg = msgspec.structs.replace(vae.cfg, latents_mean=tuple(mean), latents_std=tuple(std))
    return vae


def save_vae_file(path: Path, vae) -> None:
    """Write ``vae``'s weights and config (latent statistics included) to ``path`` (:data:`VAE_FILE`)."""
    state = {k: v.detach().cpu().contiguous() for k, v in vae.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={"config": msgspec.json.encode(vae.cfg).decode()})


def load_vae_file(path: Path, device: torch.device | str = "cpu"):
    """The VAE written by :func:`save_vae_file` (eval mode, no gradients).

    Raises:
        ValueError: the file has no ``config`` metadata (not written by :func:`save_vae_file`).
    """
    from lf_ir.recipes.wan_vae import WanVAEConfig

    with safe_open(str(path), framework="pt", device=str(device)) as f:
        meta = f.metadata() or {}
        if "config" not in meta:
            raise ValueError(f"{path}: no 'config' metadata (not a VAE file of a video run)")
        weights = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    return _vae(msgspec.json.decode(meta["config"], type=WanVAEConfig), device, weights)


__all__ = ["VAE_FILE", "is_vae_run", "latent_stats", "load_run_vae", "load_vae_file", "run_vae_config",
           "run_vae_id", "save_vae_file", "with_stats"]
