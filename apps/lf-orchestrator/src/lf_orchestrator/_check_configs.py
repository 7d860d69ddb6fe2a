"""The run config that `lf parallel check` trains: a recipe's tiny model on the smallest data its family trains on.

:func:`check_config` returns the sections of one ``lf run`` config (a dict, written as TOML by the caller) that
both runs of the check read: the single-process reference and the run under the plan. The generic part (a CPU,
float32, one thread, ``parallel.plan = "manual"``, a log line and the scalars of every step, checkpoints for the
comparison, clipping active, no evaluation) is here once; what differs per recipe is the table
:data:`FAMILY_SECTIONS`.

The sections depend on the recipe's family (lf-ir's ``RecipeSpec.family``): :data:`FAMILY_SECTIONS`, so a new
recipe of a family gets its check config with no edit here. They follow
the tiny configs of the family tests (``tests/test_families_parallel.py``, ``test_family_context.py``,
``conftest.py``): llama3 on 60,000 characters of the offline docstring corpus, the vlm and VLA recipes on three
generated Meta-World ``reach-v3`` episodes of 32-pixel frames (MuJoCo, generated once into the cache folder), and
wan_dit on synthetic latents (no dataset, no VAE: the check compares the trainer's steps, not what the data
means).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

CLIP = 0.01
"""Default ``train.grad_clip`` of the check: below the gradient norms of the tiny models' first steps (about 0.1
to 10), so the clipping path (:func:`lf_parallel.clip_grad_norm_` on the plan's mesh) runs at every step; the
command reports each step whose norm was not above it."""


def _metaworld(cache: Path) -> dict:
    """The ``[data]`` section of three generated ``reach-v3`` episodes (the tests' session dataset: same
    parameters, so ``lf_data.generate_metaworld`` returns an existing copy at once)."""
    return {"source": "metaworld", "path": str(cache / "metaworld-reach-v3-32px"), "tasks": ["reach-v3"],
            "episodes_per_task": 3, "image_size": 32, "max_steps": 60, "workers": 1}


def _llm(recipe: str, cache: Path) -> dict:
    return {"model": {"recipe": recipe, "overrides": {"vocab_size": 1024}},
            "corpus": {"cache_dir": str(cache / "corpus"), "max_chars": 60000, "seq_len": 64}}


def _vlm(recipe: str, cache: Path) -> dict:
    return {"model": {"recipe": recipe}, "data": _metaworld(cache), "vlm": {"eval_fraction": 0.25}}


def _video(recipe: str, cache: Path) -> dict:
    return {"model": {"recipe": recipe, "overrides": {"text_len": 8, "dim": 48, "heads": 4, "ffn_dim": 64}},
            "data": {"tasks": ["reach-v3"]},
            "video": {"latents": "synthetic", "frames": 9, "height": 32, "width": 32, "synthetic_clips": 16}}


def _vla(recipe: str, cache: Path) -> dict:
    return {"model": {"recipe": recipe, "overrides": {"patch_size": 8}},
            "data": {**_metaworld(cache), "action_horizon": 2, "max_instruction_len": 6}}


FAMILY_SECTIONS: dict[str, Callable[[str, Path], dict]] = {
    "llm": _llm, "vlm": _vlm, "video": _video, "vla": _vla, "vla_flow": _vla}
"""A recipe's family -> its sections of the check config, given the recipe and the cache folder."""


def check_config(recipe: str, size: str, cache: Path, *, steps: int, global_batch: int, grad_clip: float,
                 ckpt_every: int) -> dict:
    """The sections of the check's run config for ``recipe`` / ``size`` (a dict of TOML tables).

    Args:
        recipe: ``model.recipe`` (a registered recipe of a family in :data:`FAMILY_SECTIONS`).
        size: ``model.size`` (validated when the config loads).
        cache: folder of the data caches (corpus, Meta-World episodes), shared by checks.
        steps: optimizer steps (``train.steps``).
        global_batch: samples per step (``train.global_batch``).
        grad_clip: ``train.grad_clip``.
        ckpt_every: steps between checkpoints; the newest ``steps`` are kept.

    Raises:
        ValueError: an unknown recipe, or one whose family has no check config (the message lists the recipes
            that have one).
    """
    from lf_ir import RECIPES, recipe_spec

    family = recipe_spec(recipe, where="--recipe").family
    if family not in FAMILY_SECTIONS:
        known = sorted(name for name, spec in RECIPES.items() if spec.family in FAMILY_SECTIONS)
        raise ValueError(f"--recipe: no check config for recipe {recipe!r} (family {family!r}); expected one of "
                         f"{', '.join(known)}")
    sections = FAMILY_SECTIONS[family](recipe, Path(cache).resolve())
    sections["model"] = {**sections["model"], "size": size}
    generic = {
        "run": {"name": f"check-{recipe}", "device": "cpu", "threads": 1, "seed": 0},
        "train": {"steps": steps, "global_batch": global_batch, "lr": 3e-3, "warmup_steps": 1, "log_every": 1,
                  "ckpt_every": ckpt_every, "keep_checkpoints": steps, "grad_clip": grad_clip},
        "parallel": {"plan": "manual", "micro_batch": global_batch},
        "memory": {"precision": "fp32", "recompute": "none"},
        "eval": {"at_end": False},
    }
    for name, table in generic.items():
        sections[name] = {**table, **sections.get(name, {})}
    return sections
