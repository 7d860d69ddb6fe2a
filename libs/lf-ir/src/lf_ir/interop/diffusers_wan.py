"""diffusers ``WanTransformer3DModel`` checkpoints <-> the ``wan_dit`` recipe, through safetensors.

Names only, no tensor changes (the interleaved 3D RoPE is the peer's, so q/k rows
keep their order). ``T`` is ``components.text.layers.0.``, ``V`` is
``components.video.layers.``; block ``i`` is ``V{i+2}``, the head ``V{L+2}``.

=====================================================  ==============================================
diffusers name                                         lf name
=====================================================  ==============================================
``condition_embedder.text_embedder.linear_{1,2}.*``    ``T linear_{1,2}.*``
``patch_embedding.*``                                  ``V0.proj.*``
``condition_embedder.time_embedder.linear_{1,2}.*``    ``V1.linear_{1,2}.*``
``condition_embedder.time_proj.*``                     ``V1.time_proj.*``
``blocks.{i}.scale_shift_table``                       ``V{i+2}.modulation.table``
``blocks.{i}.attn{1,2}.to_{q,k,v}.*``                  ``V{i+2}.{self,cross}_attn.{q,k,v}.*``
``blocks.{i}.attn{1,2}.to_out.0.*``                    ``V{i+2}.{self,cross}_attn.o.*``
``blocks.{i}.attn{1,2}.norm_{q,k}.weight``             ``V{i+2}.{self,cross}_attn.norm_{q,k}.weight``
``blocks.{i}.norm2.{weight,bias}``                     ``V{i+2}.norm2.{weight,bias}``
``blocks.{i}.ffn.net.0.proj.*`` / ``ffn.net.2.*``      ``V{i+2}.ffn.up.*`` / ``V{i+2}.ffn.down.*``
``scale_shift_table`` / ``proj_out.*``                 ``V{L+2}.modulation.table`` / ``V{L+2}.proj.*``
=====================================================  ==============================================

Files: ``config.json`` and ``diffusion_pytorch_model.safetensors`` (or shards
with ``diffusion_pytorch_model.safetensors.index.json``) as written by
``save_pretrained``. Text-to-video only: configs with an image branch
(``image_dim`` / ``added_kv_proj_dim``) are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lf_ir.recipes.wan_dit import WanDiTConfig, WanDiTModel

_T, _V = "components.text.layers.0.", "components.video.layers."
_WEIGHTS = "diffusion_pytorch_model.safetensors"
_ATTN = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0"}


def _name_map(cfg: WanDiTConfig) -> dict[str, str]:
    """lf state-dict name -> diffusers name, for every tensor the lf model owns."""
    wb = ("weight", "bias")
    names = {f"{_T}linear_{j}.{p}": f"condition_embedder.text_embedder.linear_{j}.{p}" for j in (1, 2) for p in wb}
    names.update({f"{_V}0.proj.{p}": f"patch_embedding.{p}" for p in wb})
    names.update({f"{_V}1.linear_{j}.{p}": f"condition_embedder.time_embedder.linear_{j}.{p}"
                  for j in (1, 2) for p in wb})
    names.update({f"{_V}1.time_proj.{p}": f"condition_embedder.time_proj.{p}" for p in wb})
    for i in range(cfg.layers):
        lf, df = f"{_V}{i + 2}.", f"blocks.{i}."
        names[lf + "modulation.table"] = df + "scale_shift_table"
        for ours, theirs in (("self_attn", "attn1"), ("cross_attn", "attn2")):
            names.update({f"{lf}{ours}.{a}.{p}": f"{df}{theirs}.{b}.{p}" for a, b in _ATTN.items() for p in wb})
            names.update({f"{lf}{ours}.norm_{a}.weight": f"{df}{theirs}.norm_{a}.weight" for a in "qk"})
        if cfg.cross_attn_norm:
            names.update({f"{lf}norm2.{p}": f"{df}norm2.{p}" for p in wb})
        names.update({f"{lf}ffn.up.{p}": f"{df}ffn.net.0.proj.{p}" for p in wb})
        names.update({f"{lf}ffn.down.{p}": f"{df}ffn.net.2.{p}" for p in wb})
    head = f"{_V}{cfg.layers + 2}."
    names[head + "modulation.table"] = "scale_shift_table"
    names.update({f"{head}proj.{p}": f"proj_out.{p}" for p in wb})
    return names


def _rename(state: Mapping[str, torch.Tensor], names: Mapping[str, str], what: str) -> dict[str, torch.Tensor]:
    missing = sorted(k for k in names if k not in state)
    extra = sorted(set(state) - set(names))
    if missing or extra:
        raise KeyError(f"{what} state dict does not fit the config: missing {missing}, unexpected {extra}")
    return {new: state[old] for old, new in names.items()}


def diffusers_to_lf_state(state: Mapping[str, torch.Tensor], cfg: WanDiTConfig) -> dict[str, torch.Tensor]:
    """Rename a ``WanTransformer3DModel`` state dict to ``WanDiTModel`` names (tensors shared, not copied).

    Raises:
        KeyError: tensors missing from ``state`` or left over, named.
    """
    return _rename(state, {d: lf for lf, d in _name_map(cfg).items()}, "diffusers Wan")


def lf_to_diffusers_state(state: Mapping[str, torch.Tensor], cfg: WanDiTConfig) -> dict[str, torch.Tensor]:
    """Rename a ``WanDiTModel`` state dict to ``WanTransformer3DModel`` names.

    Raises:
        KeyError: tensors missing from ``state`` or left over, named.
    """
    return _rename(state, _name_map(cfg), "lf wan_dit")


_LF_ONLY = ("text_len", "vae_stride", "frames", "height", "width")


def wan_config_from_diffusers(config: Mapping, **overrides) -> WanDiTConfig:
    """A WanDiTConfig from the dict of a diffusers ``config.json`` (``WanTransformer3DModel.config``).

    ``qk_norm`` is not read: diffusers 0.42 builds the q/k RMSNorms whatever its value.
    Fields the diffusers config lacks (``text_len``, ``vae_stride``, ``frames``,
    ``height``, ``width``: the cost model's assumptions) keep their defaults unless
    given in ``overrides``.

    Raises:
        ValueError: an image-to-video setting the recipe does not implement, naming the key;
            an override of a field the diffusers config sets.
    """
    if set(overrides) - set(_LF_ONLY):
        raise ValueError(f"overrides: only {list(_LF_ONLY)} can be set, got {sorted(overrides)}")
    for key in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
        if config.get(key) is not None:
            raise ValueError(f"config.json: {key}={config[key]!r} (image-to-video) is not supported by the "
                             f"wan_dit recipe (text-to-video only)")
    heads, head_dim = int(config.get("num_attention_heads", 40)), int(config.get("attention_head_dim", 128))
    in_channels = int(config.get("in_channels", 16))
    return WanDiTConfig(
        dim=heads * head_dim, heads=heads, ffn_dim=int(config.get("ffn_dim", 13824)),
        layers=int(config.get("num_layers", 40)), in_channels=in_channels,
        out_channels=int(config.get("out_channels") or in_channels), text_dim=int(config.get("text_dim", 4096)),
        freq_dim=int(config.get("freq_dim", 256)), patch=tuple(int(p) for p in config.get("patch_size", (1, 2, 2))),
        eps=float(config.get("eps", 1e-6)), cross_attn_norm=bool(config.get("cross_attn_norm", True)),
        rope_max_seq_len=int(config.get("rope_max_seq_len", 1024)), **overrides)


def diffusers_config_from_wan(cfg: WanDiTConfig) -> dict:
    """The ``config.json`` dict of the ``WanTransformer3DModel`` equal to ``cfg``.

    Raises:
        ValueError: a config diffusers cannot express (rope_theta other than 10000).
    """
    if cfg.rope_theta != 10000.0:
        raise ValueError(f"rope_theta={cfg.rope_theta} cannot be expressed in a diffusers Wan config (fixed 10000)")
    return {"_class_name": "WanTransformer3DModel", "patch_size": list(cfg.patch),
            "num_attention_heads": cfg.heads, "attention_head_dim": cfg.head_dim, "in_channels": cfg.in_channels,
            "out_channels": cfg.out_channels, "text_dim": cfg.text_dim, "freq_dim": cfg.freq_dim,
            "ffn_dim": cfg.ffn_dim, "num_layers": cfg.layers, "cross_attn_norm": cfg.cross_attn_norm,
            "qk_norm": "rms_norm_across_heads", "eps": cfg.eps, "image_dim": None, "added_kv_proj_dim": None,
            "rope_max_seq_len": cfg.rope_max_seq_len, "pos_embed_seq_len": None}


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


def import_diffusers_wan(src: str | Path, **overrides) -> tuple[WanDiTConfig, dict[str, torch.Tensor]]:
    """Read a diffusers Wan transformer folder (``config.json`` + safetensors) as (config, lf state dict).

    ``overrides``: cost-model fields diffusers does not store (see :func:`wan_config_from_diffusers`).

    Raises:
        FileNotFoundError: no config.json or weights in ``src``.
        ValueError, KeyError: see :func:`wan_config_from_diffusers`, :func:`diffusers_to_lf_state`.
    """
    src = Path(src)
    if not (src / "config.json").exists():
        raise FileNotFoundError(f"{src}: no config.json")
    cfg = wan_config_from_diffusers(json.loads((src / "config.json").read_text()), **overrides)
    return cfg, diffusers_to_lf_state(_read_safetensors(src), cfg)


def load_diffusers_wan(src: str | Path, device: torch.device | str = "cpu", **overrides) -> WanDiTModel:
    """A ``WanDiTModel`` with the weights of the diffusers folder ``src`` (dtype of the file).

    ``overrides``: cost-model fields diffusers does not store, e.g. ``frames=121, text_len=256``.

    Example:
        >>> model = load_diffusers_wan("Wan2.1-T2V-1.3B-Diffusers/transformer")  # doctest: +SKIP
    """
    cfg, state = import_diffusers_wan(src, **overrides)
    with torch.device("meta"):
        model = WanDiTModel(cfg)
    model.load_state_dict(state, strict=True, assign=True)  # takes the loaded tensors, no init pass
    return model.to(device)


def export_diffusers_wan(model: WanDiTModel, dst: str | Path) -> Path:
    """Write ``model`` as a diffusers folder (``config.json`` + ``diffusion_pytorch_model.safetensors``).

    ``WanTransformer3DModel.from_pretrained(dst)`` loads it; returns ``dst``.
    """
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    state = lf_to_diffusers_state(model.state_dict(), model.cfg)
    (dst / "config.json").write_text(json.dumps(diffusers_config_from_wan(model.cfg), indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, dst / _WEIGHTS, metadata={"format": "pt"})
    return dst
