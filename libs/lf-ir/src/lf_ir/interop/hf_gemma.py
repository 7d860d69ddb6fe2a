"""HF ``GemmaForCausalLM`` (Gemma 1) checkpoints <-> the ``gemma`` recipe, through safetensors.

Names only, no tensor permutation (rotate-half RoPE, as HF's checkpoints are laid
out). HF's norm weights are the ``w`` of ``1 + w`` and so are lf's
(``Norm.zero_centered_gamma``): they are copied as they are. The head is always
tied: an ``lm_head.weight`` in the file must equal the embedding.

==========================================================  =========================================
HF name                                                     lf name (``components.text.layers.N...``)
==========================================================  =========================================
``model.embed_tokens.weight``                               ``0.weight``
``model.layers.{i}.input_layernorm.weight``                 ``{i+1}.attn_norm.weight``
``model.layers.{i}.self_attn.{q,k,v,o}_proj.weight``        ``{i+1}.attention.{q,k,v,o}.weight``
``model.layers.{i}.post_attention_layernorm.weight``        ``{i+1}.mlp_norm.weight``
``model.layers.{i}.mlp.{gate,up,down}_proj.weight``         ``{i+1}.mlp.{gate,up,down}.weight``
``model.norm.weight``                                       ``{L+1}.weight``
==========================================================  =========================================

Files: ``config.json`` and ``model.safetensors`` (or sharded ``model-*.safetensors``
with ``model.safetensors.index.json``) as written by ``save_pretrained``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from lf_ir.interop.hf_llama import _read_safetensors
from lf_ir.recipes.gemma import GemmaConfig, GemmaModel

_PREFIX = "components.text.layers."
_ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
_MLP = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
_TANH_GELU = ("gelu_pytorch_tanh", "gelu")
"""Activations HF's Gemma runs as the tanh GELU (``"gelu"``: the legacy value of the original releases, which
``GemmaConfig`` maps to ``gelu_pytorch_tanh``)."""


def _name_map(cfg: GemmaConfig) -> dict[str, str]:
    """lf state-dict name -> HF name, for every tensor the lf model owns."""
    names = {f"{_PREFIX}0.weight": "model.embed_tokens.weight",
             f"{_PREFIX}{cfg.layers + 1}.weight": "model.norm.weight"}
    for i in range(cfg.layers):
        lf, hf = f"{_PREFIX}{i + 1}.", f"model.layers.{i}."
        names[lf + "attn_norm.weight"] = hf + "input_layernorm.weight"
        names[lf + "mlp_norm.weight"] = hf + "post_attention_layernorm.weight"
        names.update({f"{lf}attention.{a}.weight": f"{hf}self_attn.{b}.weight" for a, b in _ATTN.items()})
        names.update({f"{lf}mlp.{a}.weight": f"{hf}mlp.{b}.weight" for a, b in _MLP.items()})
    return names


def hf_to_lf_state(hf_state: Mapping[str, torch.Tensor], cfg: GemmaConfig) -> dict[str, torch.Tensor]:
    """Rename a ``GemmaForCausalLM`` state dict to ``GemmaModel`` names (tensors shared, not copied).

    An ``lm_head.weight`` equal to the embedding is ignored (the head is tied).

    Raises:
        KeyError: tensors missing from ``hf_state`` or left over, named.
        ValueError: an ``lm_head.weight`` that differs from the embedding.
    """
    names = _name_map(cfg)
    extra = set(hf_state) - set(names.values())
    if "lm_head.weight" in extra and "model.embed_tokens.weight" in hf_state:
        if not torch.equal(hf_state["lm_head.weight"], hf_state["model.embed_tokens.weight"]):
            raise ValueError("lm_head.weight differs from model.embed_tokens.weight, but the gemma recipe ties "
                             "the head to the embedding")
        extra.discard("lm_head.weight")
    missing = [hf for hf in names.values() if hf not in hf_state]
    if missing or extra:
        raise KeyError(f"HF gemma state dict does not fit the config: missing {sorted(missing)}, "
                       f"unexpected {sorted(extra)}")
    return {lf: hf_state[hf] for lf, hf in names.items()}


def lf_to_hf_state(lf_state: Mapping[str, torch.Tensor], cfg: GemmaConfig) -> dict[str, torch.Tensor]:
    """Rename a ``GemmaModel`` state dict to ``GemmaForCausalLM`` names (no ``lm_head.weight``: tied).

    Raises:
        KeyError: tensors missing from ``lf_state`` or left over, named.
    """
    names = _name_map(cfg)
    missing, extra = set(names) - set(lf_state), set(lf_state) - set(names)
    if missing or extra:
        raise KeyError(f"lf gemma state dict does not fit the config: missing {sorted(missing)}, "
                       f"unexpected {sorted(extra)}")
    return {hf: lf_state[lf] for lf, hf in names.items()}


def gemma_config_from_hf(hf_config: Mapping) -> GemmaConfig:
    """A GemmaConfig from the dict of an HF ``config.json`` (``GemmaConfig.to_dict()``, transformers 4.x or 5.x).

    Raises:
        ValueError: a setting the recipe does not implement, naming the key and value (attention
            biases, an activation other than the tanh GELU, untied embeddings, bidirectional attention,
            a rope type other than default).
    """
    def get(key, default=None):
        return hf_config.get(key) if hf_config.get(key) is not None else default
    act = get("hidden_activation", get("hidden_act", "gelu_pytorch_tanh"))
    if act not in _TANH_GELU:
        raise ValueError(f"config.json: hidden_activation/hidden_act={act!r} is not supported by the gemma recipe "
                         f"(expected one of {list(_TANH_GELU)})")
    for key, ok in (("attention_bias", False), ("tie_word_embeddings", True), ("use_bidirectional_attention", False)):
        if get(key, ok) != ok:
            raise ValueError(f"config.json: {key}={get(key)!r} is not supported by the gemma recipe "
                             f"(expected {ok!r})")
    rope = dict(get("rope_parameters") or get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"config.json: rope type {rope_type!r} is not supported by the gemma recipe (default)")
    dim, heads = int(hf_config["hidden_size"]), int(hf_config["num_attention_heads"])
    return GemmaConfig(vocab_size=int(hf_config["vocab_size"]), dim=dim, layers=int(hf_config["num_hidden_layers"]),
                       heads=heads, kv_heads=int(get("num_key_value_heads", heads)),
                       head_dim=int(get("head_dim", dim // heads)), ffn_hidden=int(hf_config["intermediate_size"]),
                       norm_eps=float(get("rms_norm_eps", 1e-6)),
                       rope_theta=float(rope.get("rope_theta", get("rope_theta", 10000.0))),
                       max_seq_len=int(get("max_position_embeddings", 8192)))


def hf_config_from_gemma(cfg: GemmaConfig, dtype: str = "float32") -> dict:
    """The ``config.json`` dict of the HF ``GemmaForCausalLM`` equal to ``cfg``.

    Carries the rope base both as ``rope_parameters`` (transformers 5.x) and ``rope_theta`` (4.x), the
    activation as ``hidden_act`` and ``hidden_activation`` (4.x) and the dtype as ``dtype`` and
    ``torch_dtype``, so either major version reads it.
    """
    return {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.dim, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
            "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "intermediate_size": cfg.ffn_hidden,
            "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "max_position_embeddings": cfg.max_seq_len, "tie_word_embeddings": True, "attention_bias": False,
            "torch_dtype": dtype, "dtype": dtype}


def import_hf_gemma(src: str | Path) -> tuple[GemmaConfig, dict[str, torch.Tensor]]:
    """Read an HF Gemma folder (``config.json`` + safetensors) as (config, lf state dict).

    Raises:
        FileNotFoundError: no config.json or weights in ``src``.
        ValueError, KeyError: see :func:`gemma_config_from_hf`, :func:`hf_to_lf_state`.
    """
    src = Path(src)
    cfg = gemma_config_from_hf(json.loads((src / "config.json").read_text()))
    return cfg, hf_to_lf_state(_read_safetensors(src), cfg)


def load_hf_gemma(src: str | Path, device: torch.device | str = "cpu") -> GemmaModel:
    """A ``GemmaModel`` with the weights of the HF Gemma folder ``src`` (dtype of the file).

    Example:
        >>> model = load_hf_gemma("gemma-2b")  # doctest: +SKIP
    """
    cfg, state = import_hf_gemma(src)
    with torch.device("meta"):
        model = GemmaModel(cfg)
    model.load_state_dict(state, strict=True, assign=True)  # takes the loaded tensors, no init pass
    return model.to(device)


def export_hf_gemma(model: GemmaModel, dst: str | Path) -> Path:
    """Write ``model`` as an HF Gemma folder (``config.json`` + ``model.safetensors``); returns ``dst``.

    Each file is written under a temporary name and renamed. ``GemmaForCausalLM.from_pretrained(dst)`` loads it.
    """
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    state = lf_to_hf_state(model.state_dict(), model.cfg)
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    tmp = dst / "config.json.tmp"
    tmp.write_text(json.dumps(hf_config_from_gemma(model.cfg, dtype), indent=2))
    tmp.replace(dst / "config.json")
    tmp = dst / "model.safetensors.tmp"
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, tmp, metadata={"format": "pt"})
    tmp.replace(dst / "model.safetensors")
    return dst
