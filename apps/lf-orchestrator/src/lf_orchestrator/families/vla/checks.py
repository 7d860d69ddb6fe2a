"""Cheap config checks of the VLA families, run by ``load_config`` before any work (no torch import)."""

from __future__ import annotations


def check_vla_config(cfg, where: str) -> None:
    """``model.size`` / ``model.overrides`` of a ``vla`` / ``vla_flow`` recipe (the graph is built with nominal
    encoder sizes, so bad overrides fail now) and the ``[action_tokenizer]`` rules.

    Raises:
        ConfigError: naming the dotted key, what was expected and what was given.
    """
    import msgspec

    from lf_orchestrator.config import ActionTokenizerSection, ConfigError
    from lf_orchestrator.families.recipes import OverrideError, recipe_overrides

    m = cfg.model
    if m.recipe == "vla_flow":
        from lf_ir.recipes._vla_flow_graph import SIZES, build_graph
        from lf_ir.recipes._vla_flow_graph import VLAFlowConfig as RecipeConfig

        if cfg.action_tokenizer != ActionTokenizerSection():
            raise ConfigError(f"{where}: action_tokenizer: does not apply to model.recipe = 'vla_flow' (its actions "
                              f"are continuous, normalized by the dataset mean/std); remove the section")
    else:
        from lf_ir.recipes.vla import SIZES, build_graph
        from lf_ir.recipes.vla import VLAConfig as RecipeConfig
    if m.size not in SIZES:
        raise ConfigError(f"{where}: model.size: expected one of {sorted(SIZES)}, got {m.size!r} "
                          f"(sizes of recipe {m.recipe!r})")
    try:
        overrides = recipe_overrides(RecipeConfig, m.overrides, m.recipe)
    except OverrideError as err:
        raise ConfigError(f"{where}: {err}") from None
    if m.recipe == "vla" and "action_tokens" in m.overrides:
        raise ConfigError(f"{where}: model.overrides: 'action_tokens' is set by the action tokenizer "
                          f"(binning: horizon x dims; FAST: action_tokenizer.max_action_tokens + 1); remove it")
    try:
        build_graph(RecipeConfig(**{**SIZES[m.size], **overrides}))
    except (ValueError, TypeError, msgspec.ValidationError) as err:
        raise ConfigError(f"{where}: model: {err}") from None
    from lf_orchestrator.families._checks import check_train_plan_fields

    check_train_plan_fields(cfg, where)
