"""Model families, all trained by the one trainer (:class:`lf_orchestrator.train.Trainer`): ``llm`` (llama3),
``vlm`` (qwen2_vl), ``video`` (wan_dit), ``video_vae`` (wan_vae) and ``vla`` (the ``vla`` and ``vla_flow``
recipes).

A family turns the run config into a model, batches and a loss (:class:`~.base.Family`); the trainer runs any
of them under an lf-parallel plan. Importing this package is light (no torch): ``config.py`` uses
:func:`check_family`.
"""

from __future__ import annotations

import importlib
from typing import Any

FAMILY_MODULES: dict[str, str] = {"llm": "llm", "vlm": "vlm", "video": "video", "video_vae": "video_vae",
                                  "vla": "vla", "vla_flow": "vla"}
"""A recipe's family (``lf_ir.RecipeSpec.family``) -> its module under ``lf_orchestrator.families``."""


def family_module(recipe: str):
    """The family module of ``model.recipe`` (by its :class:`lf_ir.RecipeSpec` family); each has
    ``make_family(cfg, run_dir, ctx)``. Raises ValueError for an unknown recipe, KeyError for a family that
    ``lf run`` does not train (the config check refuses both first)."""
    from lf_ir import recipe_spec

    return importlib.import_module(f"lf_orchestrator.families.{FAMILY_MODULES[recipe_spec(recipe).family]}")


def check_family(cfg: Any, where: str) -> None:
    """Config checks of the recipe's family; ConfigError naming the dotted key otherwise."""
    from lf_ir import recipe_spec

    if FAMILY_MODULES[recipe_spec(cfg.model.recipe).family] == "vla":  # its config needs the fitted encoder
        from lf_orchestrator.families.vla.checks import check_vla_config

        return check_vla_config(cfg, where)
    from lf_orchestrator.families._checks import check_family_config

    check_family_config(cfg, where)


__all__ = ["FAMILY_MODULES", "check_family", "family_module"]
