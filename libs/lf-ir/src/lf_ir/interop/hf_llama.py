"""HF ``LlamaForCausalLM`` checkpoints <-> the ``llama3`` recipe, through safetensors.

Names only, no tensor permutation: lf's RoPE pairs feature ``i`` with
``i + head_dim/2`` (the "rotate half" convention of HF ``transformers``), which is
the layout HF checkpoints already have (Meta's original interleaved checkpoints
are permuted by HF's conversion script; convert those with it first).

==========================================================  =========================================
HF name                                                     lf name (``components.text.layers.N...``)
==========================================================  =========================================
``model.embed_tokens.weight``                               ``0.weight``
``model.layers.{i}.input_layernorm.weight``                 ``{i+1}.attn_norm.weight``
``model.layers.{i}.self_attn.{q,k,v,o}_proj.weight``        ``{i+1}.attention.{q,k,v,o}.weight``
``model.layers.{i}.post_attention_layernorm.weight``        ``{i+1}.mlp_norm.weight``
``model.layers.{i}.mlp.{gate,up,down}_proj.weight``         ``{i+1}.mlp.{gate,up,down}.weight``
``model.norm.weight``                                       ``{L+1}.weight``
``lm_head.weight`` (absent when tied)                       ``{L+2}.weight`` (absent when tied)
==========================================================  =========================================

Files: ``config.json`` and ``model.safetensors`` (or sharded
``model-*.safetensors`` with ``model.safetensors.index.json``) as written by
``save_pretrained``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lf_ir.recipes.llama3 import Llama3Config, Llama3Model

_PREFIX = "components.text.layers."
_ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
_MLP = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def _name_map(cfg: Llama3Config) -> dict[str, str]:
    """lf state-dict name -> HF name, for every tensor the lf model owns."""
    names = {f"{_PREFIX}0.weight": "model.embed_tokens.weight",
             f"{_PREFIX}{cfg.layers + 1}.weight": "model.norm.weight"}
    if not cfg.tie_embeddings:
        names[f"{_PREFIX}{cfg.layers + 2}.weight"] = "lm_head.weight"
    for i in range(cfg.layers):
        lf, hf = f"{_PREFIX}{i + 1}.", f"model.layers.{i}."
        names[lf + "attn_norm.weight"] = hf + "input_layernorm.weight"
        names[lf + "mlp_norm.weight"] = hf + "post_attention_layernorm.weight"
        names.update({f"{lf}attention.{a}.weight": f"{hf}self_attn.{b}.weight" for a, b in _ATTN.items()})
        names.update({f"{lf}mlp.{a}.weight": f"{hf}mlp.{b}.weight" for a, b in _MLP.items()})
    return names


def hf_to_lf_state(hf_state: Mapping[str, torch.Tensor], cfg: Llama3Config) -> dict[str, torch.Tensor]:
    """Rename a ``LlamaForCausalLM`` state dict to ``Llama3Model`` names (tensors shared, not copied).

    A tied config ignores an ``lm_head.weight`` equal to the embedding.

    Raises:
        KeyError: tensors missing from ``hf_state`` or left over, named.
        ValueError: an ``lm_head.weight`` that differs from the embedding in a tied config.
    """
    names = _name_map(cfg)
    extra = set(hf_state) - set(names.values())
    if cfg.tie_embeddings and "lm_head.weight" in extra:
        if not torch.equal(hf_state["lm_head.weight"], hf_state["model.embed_tokens.weight"]):
            raise ValueError("lm_head.weight differs from model.embed_tokens.weight but "
                             "tie_embeddings=True")
        extra.discard("lm_head.weight")
    missing = [hf for hf in names.values() if hf not in hf_state]
    if missing or extra:
        raise KeyError(f"HF llama state dict does not fit the config: missing {sorted(missing)}, "
                       f"unexpected {sorted(extra)}")
    return {lf: hf_state[hf] for lf, hf in names.items()}


def lf_to_hf_state(lf_state: Mapping[str, torch.Tensor], cfg: Llama3Config) -> dict[str, torch.Tensor]:
    """Rename a ``Llama3Model`` state dict to ``LlamaForCausalLM`` names (tied: no ``lm_head.weight``).

    Raises:
        KeyError: tensors missing from ``lf_state`` or left over, named.
    """
    names = _name_map(cfg)
    missing, extra = set(names) - set(lf_state), set(lf_state) - set(names)
    if missing or extra:
        raise KeyError(f"lf llama3 state dict does not fit the config: missing {sorted(missing)}, "
                       f"unexpected {sorted(extra)}")
    return {hf: lf_state[lf] for lf, hf in names.items()}


def llama3_config_from_hf(hf_config: Mapping) -> Llama3Config:
    """A Llama3Config from the dict of an HF ``config.json`` (``LlamaConfig.to_dict()``).

    Reads ``rope_scaling`` (transformers 4.x) or ``rope_parameters`` (5.x).

    Raises:
        ValueError: a setting the recipe does not implement, naming the key and value
            (biases, an activation other than silu, a head_dim other than
            hidden_size / num_attention_heads, a rope type other than default/llama3).
    """
    def get(key, default=None):
        return hf_config.get(key, default) if hf_config.get(key) is not None else default
    for key, ok in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
        if get(key, ok) != ok:
            raise ValueError(f"config.json: {key}={get(key)!r} is not supported by the llama3 recipe "
                             f"(expected {ok!r})")
    dim, heads = int(hf_config["hidden_size"]), int(hf_config["num_attention_heads"])
    if get("head_dim") is not None and get("head_dim") * heads != dim:
        raise ValueError(f"config.json: head_dim={get('head_dim')} must equal hidden_size / "
                         f"num_attention_heads = {dim} / {heads}")
    rope = dict(get("rope_parameters") or get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(f"config.json: rope type {rope_type!r} is not supported (default or llama3)")
    fields = dict(vocab_size=int(hf_config["vocab_size"]), dim=dim, layers=int(hf_config["num_hidden_layers"]),
                  heads=heads, kv_heads=int(get("num_key_value_heads", heads)),
                  ffn_hidden=int(hf_config["intermediate_size"]), norm_eps=float(get("rms_norm_eps", 1e-6)),
                  rope_theta=float(rope.get("rope_theta", get("rope_theta", 10000.0))),
                  rope_scaling="llama3" if rope_type == "llama3" else "none",
                  max_seq_len=int(get("max_position_embeddings", 2048)),
                  tie_embeddings=bool(get("tie_word_embeddings", False)))
    if rope_type == "llama3":
        fields.update(rope_factor=float(rope["factor"]), rope_low_freq_factor=float(rope["low_freq_factor"]),
                      rope_high_freq_factor=float(rope["high_freq_factor"]),
                      rope_original_max_len=int(rope["original_max_position_embeddings"]))
    return Llama3Config(**fields)


def hf_config_from_llama3(cfg: Llama3Config, dtype: str = "float32") -> dict:
    """The ``config.json`` dict of the HF ``LlamaForCausalLM`` equal to ``cfg``.

    Carries the rope settings both as ``rope_parameters`` (transformers 5.x) and
    as ``rope_theta`` + ``rope_scaling`` (4.x), and the dtype as ``dtype`` and
    ``torch_dtype``, so either major version reads it.
    """
    scaling = None
    if cfg.rope_scaling == "llama3":
        scaling = {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": cfg.rope_low_freq_factor,
                   "high_freq_factor": cfg.rope_high_freq_factor,
                   "original_max_position_embeddings": cfg.rope_original_max_len}
    parameters = {**(scaling or {"rope_type": "default"}), "rope_theta": cfg.rope_theta}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.dim, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
            "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "intermediate_size": cfg.ffn_hidden,
            "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
            "rope_scaling": scaling, "max_position_embeddings": cfg.max_seq_len,
            "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "mlp_bias": False,
            "rope_parameters": parameters, "torch_dtype": dtype, "dtype": dtype}


def _read_safetensors(src: Path) -> dict[str, torch.Tensor]:
    index = src / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(src / shard))
        return state
    if not (src / "model.safetensors").exists():
        raise FileNotFoundError(f"{src}: no model.safetensors or model.safetensors.index.json")
    return load_file(src / "model.safetensors")


def import_hf_llama(src: str | Path) -> tuple[Llama3Config, dict[str, torch.Tensor]]:
    """Read an HF Llama folder (``config.json`` + safetensors) as (config, lf state dict).

    Raises:
        FileNotFoundError: no config.json or weights in ``src``.
        ValueError, KeyError: see :func:`llama3_config_from_hf`, :func:`hf_to_lf_state`.
    """
    src = Path(src)
    cfg = llama3_config_from_hf(json.loads((src / "config.json").read_text()))
    return cfg, hf_to_lf_state(_read_safetensors(src), cfg)


def load_hf_llama(src: str | Path, device: torch.device | str = "cpu") -> Llama3Model:
    """A ``Llama3Model`` with the weights of the HF Llama folder ``src`` (dtype of the file).

    Example:
        >>> model = load_hf_llama("Llama-3.2-1B")  # doctest: +SKIP
    """
    cfg, state = import_hf_llama(src)
    with torch.device("meta"):
        model = Llama3Model(cfg)
    model.load_state_dict(state, strict=True, assign=True)  # takes the loaded tensors, no init pass
    return model.to(device)


def export_hf_llama(model: Llama3Model, dst: str | Path) -> Path:
    """Write ``model`` as an HF Llama folder (``config.json`` + ``model.safetensors``); returns ``dst``.

    ``LlamaForCausalLM.from_pretrained(dst)`` loads it.
    """
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    state = lf_to_hf_state(model.state_dict(), model.cfg)
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    (dst / "config.json").write_text(json.dumps(hf_config_from_llama3(model.cfg, dtype), indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, dst / "model.safetensors",
              metadata={"format": "pt"})
    return dst
