"""Cheap config checks of the VLA families, run by ``load_config`` before any work (no torch import)."""

from __future__ import annotations


def check_vla_config(cfg, where: str) -> None:
    """``model.size`` / ``model.overrides`` of a ``vla`` / ``vla_flow`` recipe (the graph is built with nominal
    encoder sizes, so bad overrides fail now) and the ``[action_tokenizer]`` rules.

    Raises:
        ConfigError: naming the dotted key, what was expected and what was given.
    """
    import msgspec

    from lf_ir import recipe_spec
    from lf_orchestrator.config import ActionTokenizerSection, ConfigError
    from lf_orchestrator.families.recipes import OverrideError, recipe_overrides

    m = cfg.model
    spec = recipe_spec(m.recipe, where="model.recipe")
    if m.recipe == "vla_flow" and cfg.action_tokenizer != ActionTokenizerSection():
        raise ConfigError(f"{where}: action_tokenizer: does not apply to model.recipe = 'vla_flow' (its actions "
                          f"are continuous, normalized by the dataset mean/std); remove the section")
    try:
        size = spec.size_name(m.size)
        overrides = recipe_overrides(spec.config_class, m.overrides, m.recipe)
    except OverrideError as err:
        raise ConfigError(f"{where}: {err}") from None
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    if m.recipe == "vla" and "action_tokens" in m.overrides:
        raise ConfigError(f"{where}: model.overrides: 'action_tokens' is set by the action tokenizer "
                          f"(binning: horizon x dims; FAST: action_tokenizer.max_action_tokens + 1); remove it")
    try:
        spec.build_graph(spec.config_class(**{**spec.sizes[size], **overrides}))
    except (ValueError, TypeError, msgspec.ValidationError) as err:
        raise ConfigError(f"{where}: model: {err}") from None
    from lf_orchestrator.families._checks import check_train_plan_fields

    check_train_plan_fields(cfg, where)
