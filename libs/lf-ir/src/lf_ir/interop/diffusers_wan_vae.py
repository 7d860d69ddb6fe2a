"""diffusers ``AutoencoderKLWan`` checkpoints <-> the ``wan_vae`` recipe, through safetensors.

The graph's node names are diffusers' module paths, so a name maps as
``{kind}.{level}.layers.{i}.{lf suffix}`` <-> ``{node name}.{diffusers suffix}``;
tensors are reshaped, never permuted:

=========================================  ==========================================  ==========================
lf suffix                                  diffusers suffix                            diffusers shape
=========================================  ==========================================  ==========================
``weight`` of a bare channel norm          ``gamma``                                   (C, 1, 1, 1)
``norm1/norm2.weight`` (residual block)    ``norm1/norm2.gamma``                       (C, 1, 1, 1)
``shortcut.{weight,bias}``                 ``conv_shortcut.{weight,bias}``             same
``norm.weight`` (attention)                ``norm.gamma``                              (C, 1, 1)
``qkv / proj.weight`` (O, I, 1, 1, 1)      ``to_qkv / proj.weight``                    (O, I, 1, 1)
``conv.weight`` (resample, O, I, 1, 3, 3)  ``resample.1.weight``                       (O, I, 3, 3)
``conv.bias``                              ``resample.1.bias``                         same
anything else                              the same                                    same
=========================================  ==========================================  ==========================

Files: ``config.json`` and ``diffusion_pytorch_model.safetensors`` (or sharded, with
``diffusion_pytorch_model.safetensors.index.json``), as ``save_pretrained`` writes them.
Only Wan 2.1 checkpoints (``is_residual`` false, no ``patch_size``) are supported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lf_ir._nodes_vae import ChannelRMSNorm, VAEAttention, VAEResample
from lf_ir.recipes.wan_vae import WanVAE, WanVAEConfig, build_graph

_WEIGHTS = "diffusion_pytorch_model.safetensors"
_RENAME = {"shortcut": "conv_shortcut", "qkv": "to_qkv", "conv": "resample.1"}


def _diffusers_key(node, suffix: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """(diffusers suffix, diffusers shape) of one lf parameter of ``node`` (see the module table)."""
    head, _, leaf = suffix.rpartition(".")
    if isinstance(node, ChannelRMSNorm):
        return "gamma", (shape[0], 1, 1, 1)
    if head.startswith("norm"):
        return f"{head}.gamma", (shape[0], 1, 1) if isinstance(node, VAEAttention) else (shape[0], 1, 1, 1)
    if isinstance(node, VAEAttention) and leaf == "weight":  # 1x1x1 conv -> 1x1 Conv2d
        shape = shape[:4]
    if isinstance(node, VAEResample) and head == "conv" and leaf == "weight":  # (1, 3, 3) -> Conv2d 3x3
        shape = (shape[0], shape[1], *shape[3:])
    return f"{_RENAME.get(head, head)}.{leaf}" if head else suffix, shape


def name_map(cfg: WanVAEConfig) -> dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """lf state-dict name -> (diffusers name, diffusers shape, lf shape), for every tensor."""
    graph = build_graph(cfg, 1 + cfg.temporal_factor, cfg.spatial_factor, cfg.spatial_factor)
    names: dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]] = {}
    for kind in ("encoder", "decoder"):
        levels = [c for c in graph.components if c.name.startswith(kind)]
        for level, comp in enumerate(levels):
            for i, node in enumerate(comp.nodes):
                for suffix, shape in node.param_shapes().items():
                    key, hf_shape = _diffusers_key(node, suffix, shape)
                    names[f"{kind}.{level}.layers.{i}.{suffix}"] = (f"{node.name}.{key}", hf_shape, shape)
    return names


def diffusers_to_lf_state(state: Mapping[str, torch.Tensor], cfg: WanVAEConfig) -> dict[str, torch.Tensor]:
    """Rename and reshape an ``AutoencoderKLWan`` state dict to ``WanVAE`` names (views, no copies).

    Raises:
        KeyError: tensors missing from ``state`` or left over, named.
        ValueError: a tensor whose shape does not fit the config, named with both shapes.
    """
    names = name_map(cfg)
    missing = sorted(d for d, _, _ in names.values() if d not in state)
    extra = sorted(set(state) - {d for d, _, _ in names.values()})
    if missing or extra:
        raise KeyError(f"diffusers Wan VAE state dict does not fit the config: missing {missing}, "
                       f"unexpected {extra}")
    out = {}
    for lf, (d, d_shape, lf_shape) in names.items():
        if tuple(state[d].shape) != d_shape:
            raise ValueError(f"{d}: expected shape {d_shape} for the config, got {tuple(state[d].shape)}")
        out[lf] = state[d].reshape(lf_shape)
    return out


def lf_to_diffusers_state(state: Mapping[str, torch.Tensor], cfg: WanVAEConfig) -> dict[str, torch.Tensor]:
    """Rename and reshape a ``WanVAE`` state dict to ``AutoencoderKLWan`` names.

    Raises:
        KeyError: tensors missing from ``state`` or left over, named.
    """
    names = name_map(cfg)
    missing, extra = sorted(set(names) - set(state)), sorted(set(state) - set(names))
    if missing or extra:
        raise KeyError(f"lf wan_vae state dict does not fit the config: missing {missing}, unexpected {extra}")
    return {d: state[lf].reshape(d_shape) for lf, (d, d_shape, _) in names.items()}


def wan_vae_config_from_diffusers(config: Mapping) -> WanVAEConfig:
    """A WanVAEConfig from the dict of an ``AutoencoderKLWan`` ``config.json``.

    Raises:
        ValueError: a setting the recipe does not implement, naming the key and value (``is_residual``
            true (Wan 2.2), a ``patch_size``, dropout, scale factors that disagree with the levels).
    """
    for key, ok in (("is_residual", False), ("patch_size", None), ("dropout", 0.0)):
        if config.get(key, ok) != ok:
            raise ValueError(f"config.json: {key}={config[key]!r} is not supported by the wan_vae recipe "
                             f"(expected {ok!r})")
    fields = {k: config[k] for k in ("base_dim", "decoder_base_dim", "z_dim", "num_res_blocks", "in_channels",
                                     "out_channels") if config.get(k) is not None}
    fields.update({k: tuple(config[k]) for k in ("dim_mult", "attn_scales", "temperal_downsample", "latents_mean",
                                                 "latents_std") if config.get(k) is not None})
    cfg = WanVAEConfig(**fields)
    for key, have in (("scale_factor_temporal", cfg.temporal_factor), ("scale_factor_spatial", cfg.spatial_factor)):
        if config.get(key) is not None and config[key] != have:
            raise ValueError(f"config.json: {key}={config[key]!r} disagrees with the levels, which give {have}")
    return cfg


def diffusers_config_from_wan_vae(cfg: WanVAEConfig) -> dict:
    """The ``config.json`` dict of the ``AutoencoderKLWan`` equal to ``cfg``."""
    return {"_class_name": "AutoencoderKLWan", "_diffusers_version": "0.35.0", "base_dim": cfg.base_dim,
            "decoder_base_dim": cfg.decoder_base_dim, "z_dim": cfg.z_dim, "dim_mult": list(cfg.dim_mult),
            "num_res_blocks": cfg.num_res_blocks, "attn_scales": list(cfg.attn_scales),
            "temperal_downsample": list(cfg.temperal_downsample), "dropout": 0.0,
            "latents_mean": list(cfg.latents_mean), "latents_std": list(cfg.latents_std), "is_residual": False,
            "in_channels": cfg.in_channels, "out_channels": cfg.out_channels, "patch_size": None,
            "scale_factor_temporal": cfg.temporal_factor, "scale_factor_spatial": cfg.spatial_factor}


def _read_safetensors(src: Path) -> dict[str, torch.Tensor]:
    index = src / f"{_WEIGHTS}.index.json"
    if index.exists():
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(src / shard))
        return state
    if not (src / _WEIGHTS).exists():
        raise FileNotFoundError(f"{src}: no {_WEIGHTS} or {_WEIGHTS}.index.json")
    return load_file(src / _WEIGHTS)


def import_diffusers_wan_vae(src: str | Path) -> tuple[WanVAEConfig, dict[str, torch.Tensor]]:
    """Read an ``AutoencoderKLWan`` folder (``config.json`` + safetensors) as (config, lf state dict).

    Accepts the model folder itself or a pipeline folder with a ``vae`` subfolder.

    Raises:
        FileNotFoundError: no config.json or weights in ``src``.
        ValueError, KeyError: see :func:`wan_vae_config_from_diffusers`, :func:`diffusers_to_lf_state`.
    """
    src = Path(src)
    if not (src / "config.json").exists() and (src / "vae" / "config.json").exists():
        src = src / "vae"
    if not (src / "config.json").exists():
        raise FileNotFoundError(f"{src}: no config.json")
    cfg = wan_vae_config_from_diffusers(json.loads((src / "config.json").read_text()))
    return cfg, diffusers_to_lf_state(_read_safetensors(src), cfg)


def load_diffusers_wan_vae(src: str | Path, device: torch.device | str = "cpu") -> WanVAE:
    """A ``WanVAE`` with the weights of the ``AutoencoderKLWan`` folder ``src`` (dtype of the file).

    Example:
        >>> vae = load_diffusers_wan_vae("Wan2.1-T2V-1.3B-Diffusers/vae")  # doctest: +SKIP
    """
    cfg, state = import_diffusers_wan_vae(src)
    with torch.device("meta"):
        model = WanVAE(cfg)
    model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True, assign=True)
    return model.to(device)


def export_diffusers_wan_vae(model: WanVAE, dst: str | Path) -> Path:
    """Write ``model`` as an ``AutoencoderKLWan`` folder (``config.json`` + safetensors); returns ``dst``.

    ``AutoencoderKLWan.from_pretrained(dst)`` loads it.
    """
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    state = lf_to_diffusers_state(model.state_dict(), model.cfg)
    (dst / "config.json").write_text(json.dumps(diffusers_config_from_wan_vae(model.cfg), indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, dst / _WEIGHTS,
              metadata={"format": "pt"})
    return dst
