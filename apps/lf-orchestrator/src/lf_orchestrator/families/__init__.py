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

FAMILY_RECIPES: dict[str, str] = {"llama3": "llm", "qwen2_vl": "vlm", "wan_dit": "video",
                                  "wan_vae": "video_vae", "vla": "vla", "vla_flow": "vla"}
"""``model.recipe`` -> family module under ``lf_orchestrator.families``."""


def family_module(recipe: str):
    """The family module (``llm``, ``vlm``, ``video``, ``video_vae``, ``vla``) of ``model.recipe``; KeyError
    otherwise. Each has ``make_family(cfg, run_dir, ctx)``."""
    return importlib.import_module(f"lf_orchestrator.families.{FAMILY_RECIPES[recipe]}")


def check_family(cfg: Any, where: str) -> None:
    """Config checks of the recipe's family; ConfigError naming the dotted key otherwise."""
    if FAMILY_RECIPES[cfg.model.recipe] == "vla":  # its recipe config needs the fitted encoder: nominal sizes
        from lf_orchestrator.families.vla.checks import check_vla_config

        return check_vla_config(cfg, where)
    from lf_orchestrator.families._checks import check_family_config

    check_family_config(cfg, where)


__all__ = ["FAMILY_RECIPES", "check_family", "family_module"]
