"""The VLA families (``model.recipe = "vla"``: action tokens, binning or FAST; ``"vla_flow"``: a flow-matching
action expert) under the one trainer: robot data, the batch encoder, closed-loop evaluation and baselines.

Importing this package is light (no torch): the config check (:mod:`.checks`) runs before any work.
Modules: :mod:`._family` (the family adapter), :mod:`.assembly` (encoder and model of a run folder),
:mod:`.flow_batch` / :mod:`._fast_actions` (batch encoders), :mod:`._action_clip` (tokenizer-bounds check),
:mod:`.evaluate` (closed loop in Meta-World), :mod:`.baselines` (the BC MLP), :mod:`.report` (the success table).
"""

from __future__ import annotations


def make_family(cfg, run_dir, ctx):
    """The family object of ``model.recipe = "vla"`` or ``"vla_flow"``."""
    from lf_orchestrator.families.vla._family import VLAFamily

    return VLAFamily(cfg, run_dir, ctx)


__all__ = ["make_family"]
