"""HF ``Qwen2VLForConditionalGeneration`` checkpoints <-> the ``qwen2_vl`` recipe, through safetensors.

Checkpoint names are those of the published Qwen2-VL checkpoints, which
transformers 5.x ``save_pretrained`` still writes (``visual.*``, ``model.*``); the
in-memory names of transformers 5.x (``model.visual.*``, ``model.language_model.*``)
are accepted on import (:func:`normalize_hf_names`). The ViT's fused ``qkv`` is
split into lf's ``q``, ``k``, ``v`` (rows ``[0, d)``, ``[d, 2d)``, ``[2d, 3d)``) on
import and concatenated on export, so tensor parallelism splits plain matrices.

===========================================================  ==========================================
HF name                                                      lf name
===========================================================  ==========================================
``visual.patch_embed.proj.weight``                           ``components.vision.layers.0.proj.weight``
``visual.blocks.{i}.norm1 / norm2``                          ``vision.layers.{i+1}.attn_norm / mlp_norm``
``visual.blocks.{i}.attn.qkv``                               ``vision.layers.{i+1}.attention.{q,k,v}``
``visual.blocks.{i}.attn.proj``                              ``vision.layers.{i+1}.attention.o``
``visual.blocks.{i}.mlp.fc1 / fc2``                          ``vision.layers.{i+1}.mlp.up / down``
``visual.merger.ln_q / mlp.0 / mlp.2``                       ``vision.layers.{V+1}.norm / fc1 / fc2``
``model.embed_tokens.weight``                                ``components.text.layers.0.weight``
``model.layers.{i}.input_layernorm / post_attention_...``    ``text.layers.{i+1}.attn_norm / mlp_norm``
``model.layers.{i}.self_attn.{q,k,v,o}_proj``                ``text.layers.{i+1}.attention.{q,k,v,o}``
``model.layers.{i}.mlp.{gate,up,down}_proj``                 ``text.layers.{i+1}.mlp.{gate,up,down}``
``model.norm.weight`` / ``lm_head.weight`` (untied)          ``text.layers.{L+1}.weight`` / ``{L+2}.weight``
===========================================================  ==========================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from lf_ir.interop.hf_llama import _read_safetensors
from lf_ir.recipes.qwen2_vl import Qwen2VLConfig, Qwen2VLModel

_V, _T = "components.vision.layers.", "components.text.layers."
_QKV = "qkv"  # marker of a fused ViT q/k/v tensor in the name map


def _name_map(cfg: Qwen2VLConfig) -> dict[str, str]:
    """lf name -> HF name for every tensor; the ViT's q/k/v map to ``...qkv.<leaf>#q`` etc."""
    names = {f"{_V}0.proj.weight": "visual.patch_embed.proj.weight",
             f"{_T}0.weight": "model.embed_tokens.weight", f"{_T}{cfg.layers + 1}.weight": "model.norm.weight"}
    merger = f"{_V}{cfg.vision_layers + 1}."
    for lf, hf in (("norm", "ln_q"), ("fc1", "mlp.0"), ("fc2", "mlp.2")):
        names.update({f"{merger}{lf}.{leaf}": f"visual.merger.{hf}.{leaf}" for leaf in ("weight", "bias")})
    if not cfg.tie_embeddings:
        names[f"{_T}{cfg.layers + 2}.weight"] = "lm_head.weight"
    for i in range(cfg.vision_layers):
        lf, hf = f"{_V}{i + 1}.", f"visual.blocks.{i}."
        for leaf in ("weight", "bias"):
            names.update({f"{lf}attn_norm.{leaf}": f"{hf}norm1.{leaf}", f"{lf}mlp_norm.{leaf}": f"{hf}norm2.{leaf}",
                          f"{lf}attention.o.{leaf}": f"{hf}attn.proj.{leaf}",
                          f"{lf}mlp.up.{leaf}": f"{hf}mlp.fc1.{leaf}", f"{lf}mlp.down.{leaf}": f"{hf}mlp.fc2.{leaf}"})
            names.update({f"{lf}attention.{p}.{leaf}": f"{hf}attn.{_QKV}.{leaf}#{p}" for p in "qkv"})
    for i in range(cfg.layers):
        lf, hf = f"{_T}{i + 1}.", f"model.layers.{i}."
        names[lf + "attn_norm.weight"] = hf + "input_layernorm.weight"
        names[lf + "mlp_norm.weight"] = hf + "post_attention_layernorm.weight"
        names.update({f"{lf}attention.{p}.{leaf}": f"{hf}self_attn.{p}_proj.{leaf}"
                      for p in "qkv" for leaf in ("weight", "bias")})
        names[lf + "attention.o.weight"] = hf + "self_attn.o_proj.weight"
        names.update({f"{lf}mlp.{p}.weight": f"{hf}mlp.{p}_proj.weight" for p in ("gate", "up", "down")})
    return names


def normalize_hf_names(hf_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename transformers 5.x in-memory names (``model.visual.``, ``model.language_model.``) to checkpoint names."""
    def rename(key: str) -> str:
        if key.startswith("model.visual."):
            return key.removeprefix("model.")
        if key.startswith("model.language_model."):
            return "model." + key.removeprefix("model.language_model.")
        return key
    return {rename(k): v for k, v in hf_state.items()}


def hf_to_lf_state(hf_state: Mapping[str, torch.Tensor], cfg: Qwen2VLConfig) -> dict[str, torch.Tensor]:
    """Rename (and split the ViT's fused qkv of) a Qwen2-VL state dict to ``Qwen2VLModel`` names.

    A tied config ignores an ``lm_head.weight`` equal to the embedding.

    Raises:
        KeyError: tensors missing from ``hf_state`` or left over, named.
        ValueError: an ``lm_head.weight`` that differs from the embedding in a tied config.
    """
    hf_state = normalize_hf_names(hf_state)
    names = _name_map(cfg)
    wanted = {hf.split("#")[0] for hf in names.values()}
    extra = set(hf_state) - wanted
    if cfg.tie_embeddings and "lm_head.weight" in extra:
        if not torch.equal(hf_state["lm_head.weight"], hf_state["model.embed_tokens.weight"]):
            raise ValueError("lm_head.weight differs from model.embed_tokens.weight but tie_embeddings=True")
        extra.discard("lm_head.weight")
    missing = wanted - set(hf_state)
    if missing or extra:
        raise KeyError(f"HF qwen2_vl state dict does not fit the config: missing {sorted(missing)}, "
                       f"unexpected {sorted(extra)}")
    out = {}
    for lf, hf in names.items():
        key, _, part = hf.partition("#")
        out[lf] = hf_state[key] if not part else hf_state[key].chunk(3, dim=0)["qkv".index(part)]
    return out


def lf_to_hf_state(lf_state: Mapping[str, torch.Tensor], cfg: Qwen2VLConfig) -> dict[str, torch.Tensor]:
    """Rename a ``Qwen2VLModel`` state dict (or its gradients) to checkpoint names, fusing the ViT's q/k/v.

    Raises:
        KeyError: tensors missing from ``lf_state`` or left over, named.
    """
    names = _name_map(cfg)
    missing, extra = set(names) - set(lf_state), set(lf_state) - set(names)
    if missing or extra:
        raise KeyError(f"lf qwen2_vl state dict does not fit the config: missing {sorted(missing)}, "
                       f"unexpected {sorted(extra)}")
    out, fused = {}, {}
    for lf, hf in names.items():
        key, _, part = hf.partition("#")
        if part:
            fused.setdefault(key, {})[part] = lf_state[lf]
        else:
            out[key] = lf_state[lf]
    out.update({key: torch.cat([parts[p] for p in "qkv"]) for key, parts in fused.items()})
    return out


def qwen2_vl_config_from_hf(hf_config: Mapping) -> Qwen2VLConfig:
    """A Qwen2VLConfig from an HF ``config.json`` dict (nested ``text_config`` of 5.x, or the flat 4.x form).

    Raises:
        ValueError: a setting the recipe does not implement, naming the key and value (an
            activation other than silu, sliding-window attention, a rope type other than
            default / mrope, a text head_dim other than hidden_size / num_attention_heads).
    """
    text = {**hf_config, **(hf_config.get("text_config") or {})}
    vision = hf_config.get("vision_config") or {}

    def get(src, key, default=None):
        return src[key] if src.get(key) is not None else default
    if get(text, "hidden_act", "silu") != "silu":
        raise ValueError(f"config.json: text hidden_act={text['hidden_act']!r} is not supported (expected 'silu')")
    if get(text, "use_sliding_window", False):
        raise ValueError("config.json: use_sliding_window=True is not supported by the qwen2_vl recipe")
    dim, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
    if get(text, "head_dim") is not None and int(text["head_dim"]) * heads != dim:
        raise ValueError(f"config.json: head_dim={text['head_dim']} must equal hidden_size / num_attention_heads "
                         f"= {dim} / {heads}")
    rope = dict(get(text, "rope_parameters") or get(text, "rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"config.json: rope type {rope_type!r} is not supported (default or mrope)")
    vision_rope = dict(get(vision, "rope_parameters") or {})
    fields = dict(
        vocab_size=int(text["vocab_size"]), dim=dim, layers=int(text["num_hidden_layers"]), heads=heads,
        kv_heads=int(get(text, "num_key_value_heads", heads)), ffn_hidden=int(text["intermediate_size"]),
        norm_eps=float(get(text, "rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", get(text, "rope_theta", 1000000.0))),
        mrope_section=tuple(int(s) for s in rope.get("mrope_section", (16, 24, 24))),
        max_seq_len=int(get(text, "max_position_embeddings", 32768)),
        tie_embeddings=bool(hf_config.get("tie_word_embeddings") or text.get("tie_word_embeddings") or False),
        vision_dim=int(get(vision, "embed_dim", 1280)), vision_layers=int(get(vision, "depth", 32)),
        vision_heads=int(get(vision, "num_heads", 16)), vision_mlp_ratio=int(get(vision, "mlp_ratio", 4)),
        vision_act=str(get(vision, "hidden_act", "quick_gelu")),
        vision_rope_theta=float(vision_rope.get("rope_theta", 10000.0)),
        merger_dim=int(get(vision, "hidden_size", 3584)),
        in_channels=int(get(vision, "in_channels", get(vision, "in_chans", 3))),
        patch_size=int(get(vision, "patch_size", 14)), temporal_patch_size=int(get(vision, "temporal_patch_size", 2)),
        spatial_merge_size=int(get(vision, "spatial_merge_size", 2)))
    for key in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        if hf_config.get(key) is not None:
            fields[key] = int(hf_config[key])
    return Qwen2VLConfig(**fields)


def hf_config_from_qwen2_vl(cfg: Qwen2VLConfig, dtype: str = "float32") -> dict:
    """The ``config.json`` dict (transformers 5.x nested form) of the HF model equal to ``cfg``."""
    text = {"model_type": "qwen2_vl_text", "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
            "intermediate_size": cfg.ffn_hidden, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
            "num_key_value_heads": cfg.kv_heads, "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len,
            "rms_norm_eps": cfg.norm_eps, "use_sliding_window": False,
            "rope_parameters": {"rope_type": "default", "mrope_section": list(cfg.mrope_section),
                                "rope_theta": cfg.rope_theta}}
    vision = {"model_type": "qwen2_vl_vision", "depth": cfg.vision_layers, "embed_dim": cfg.vision_dim,
              "hidden_size": cfg.merger_dim, "hidden_act": cfg.vision_act, "mlp_ratio": cfg.vision_mlp_ratio,
              "num_heads": cfg.vision_heads, "in_channels": cfg.in_channels, "patch_size": cfg.patch_size,
              "spatial_merge_size": cfg.spatial_merge_size, "temporal_patch_size": cfg.temporal_patch_size,
              "rope_parameters": {"rope_type": "axial", "rope_theta": cfg.vision_rope_theta}}
    return {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "text_config": text,
            "vision_config": vision, "image_token_id": cfg.image_token_id, "video_token_id": cfg.video_token_id,
            "vision_start_token_id": cfg.vision_start_token_id, "vision_end_token_id": cfg.vision_end_token_id,
            "tie_word_embeddings": cfg.tie_embeddings, "dtype": dtype, "torch_dtype": dtype}


def import_hf_qwen2_vl(src: str | Path) -> tuple[Qwen2VLConfig, dict[str, torch.Tensor]]:
    """Read an HF Qwen2-VL folder (``config.json`` + safetensors, single or sharded) as (config, lf state dict).

    Raises:
        FileNotFoundError: no config.json or weights in ``src``.
        ValueError, KeyError: see :func:`qwen2_vl_config_from_hf`, :func:`hf_to_lf_state`.
    """
    src = Path(src)
    if not (src / "config.json").exists():
        raise FileNotFoundError(f"{src}: no config.json")
    cfg = qwen2_vl_config_from_hf(json.loads((src / "config.json").read_text()))
    return cfg, hf_to_lf_state(_read_safetensors(src), cfg)


def load_hf_qwen2_vl(src: str | Path, device: torch.device | str = "cpu") -> Qwen2VLModel:
    """A ``Qwen2VLModel`` with the weights of the HF Qwen2-VL folder ``src`` (dtype of the file).

    Example:
        >>> model = load_hf_qwen2_vl("Qwen2-VL-2B-Instruct")  # doctest: +SKIP
    """
    cfg, state = import_hf_qwen2_vl(src)
    with torch.device("meta"):
        model = Qwen2VLModel(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device)


def export_hf_qwen2_vl(model: Qwen2VLModel, dst: str | Path) -> Path:
    """Write ``model`` as an HF Qwen2-VL folder (``config.json`` + ``model.safetensors``); returns ``dst``.

    ``Qwen2VLForConditionalGeneration.from_pretrained(dst)`` loads it.
    """
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    state = lf_to_hf_state(model.state_dict(), model.cfg)
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    (dst / "config.json").write_text(json.dumps(hf_config_from_qwen2_vl(model.cfg, dtype), indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, dst / "model.safetensors",
              metadata={"format": "pt"})
    return dst
