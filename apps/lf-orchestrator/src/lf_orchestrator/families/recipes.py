"""Recipe configs and lowered models of the family recipes, built on the meta device and materialized."""

from __future__ import annotations

import importlib

_MODEL = {"llama3": ("Llama3Config", "Llama3Model"), "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLModel"),
          "wan_dit": ("WanDiTConfig", "WanDiTModel"), "wan_vae": ("WanVAEConfig", "WanVAE")}


def recipe_config(recipe: str, size: str, overrides: dict):
    """(recipe config, IR graph) of ``model.recipe`` / ``model.size`` / ``model.overrides``.

    Raises:
        ValueError: unknown size or override field (naming it), or a graph that does not validate.
    """
    mod = importlib.import_module(f"lf_ir.recipes.{recipe}")
    cls = getattr(mod, _MODEL[recipe][0])
    if size not in mod.SIZES:
        raise ValueError(f"model.size: expected one of {sorted(mod.SIZES)}, got {size!r} (sizes of recipe {recipe!r})")
    bad = sorted(set(overrides) - set(cls.__struct_fields__))
    if bad:
        raise ValueError(f"model.overrides: unknown field {bad[0]!r} for recipe {recipe!r}; "
                         f"fields: {sorted(cls.__struct_fields__)}")
    cfg = cls(**{**mod.SIZES[size], **overrides})
    return cfg, mod.build_graph(cfg)


def build_model(recipe: str, rcfg, graph, device, seed: int, *, fused_ops: bool = False):
    """The lowered model built on ``meta`` and materialized on ``device`` with lf-ir's deterministic init.

    ``fused_ops`` (``model.fused_ops``): switch its modules to lf-kernels' fused ops (``lf_ir.use_fused_ops``);
    the weights are the same either way.
    """
    import torch

    from lf_ir import materialize, use_fused_ops

    mod = importlib.import_module(f"lf_ir.recipes.{recipe}")
    with torch.device("meta"):
        model = getattr(mod, _MODEL[recipe][1])(rcfg, graph)
    model = materialize(model, device, seed)
    if fused_ops:
        use_fused_ops(model)
    return model
