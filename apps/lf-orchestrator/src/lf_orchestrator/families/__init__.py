"""Model families trained by the recipe trainer: ``llm`` (llama3), ``vlm`` (qwen2_vl), ``video`` (wan_dit),
``video_vae`` (wan_vae).

A family turns the run config into a model, batches and a loss (:class:`~.base.Family`);
:mod:`lf_orchestrator.recipe_trainer` runs any of them under an lf-parallel plan.
Importing this package is light (no torch): ``config.py`` uses :func:`check_family`.
"""

from __future__ import annotations

import importlib
from typing import Any

FAMILY_RECIPES: dict[str, str] = {"llama3": "llm", "qwen2_vl": "vlm", "wan_dit": "video",
                                  "wan_vae": "video_vae"}
"""``model.recipe`` -> family module under ``lf_orchestrator.families``."""


def family_module(recipe: str):
    """The family module (``llm``, ``vlm``, ``video``, ``video_vae``) of ``model.recipe``; KeyError otherwise."""
    return importlib.import_module(f"lf_orchestrator.families.{FAMILY_RECIPES[recipe]}")


def check_family(cfg: Any, where: str) -> None:
    """Config checks of the llm/vlm/video families; ConfigError naming the dotted key otherwise."""
    from lf_orchestrator.families._checks import check_family_config

    check_family_config(cfg, where)


__all__ = ["FAMILY_RECIPES", "check_family", "family_module"]
