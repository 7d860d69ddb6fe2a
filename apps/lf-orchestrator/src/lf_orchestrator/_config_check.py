"""Range and consistency checks of a decoded run config (:func:`check_config`), split from :mod:`.config`.

Each failed check raises :class:`ConfigError` naming the dotted key, what was expected and the value
received. :func:`lf_orchestrator.config.load_config` runs them after decoding; the model check, the only one
that imports torch, runs last.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lf_orchestrator._config_errors import ConfigError

if TYPE_CHECKING:
    from lf_orchestrator.config import Config

__all__ = ["check_config"]


def _require(ok: bool, where: str, key: str, expected: str, got: Any) -> None:
    if not ok:
        raise ConfigError(f"{where}: {key}: expected {expected}, got {got!r}")


def check_config(cfg: Config, where: str = "config", *, check_paths: bool = True) -> Config:
    """Range checks and (with ``check_paths``) paths that must exist; ConfigError naming the key otherwise."""
    from lf_orchestrator.config import ALL_TASKS

    t, d, e = cfg.train, cfg.data, cfg.eval
    for key, value in [("train.steps", t.steps), ("train.global_batch", t.global_batch),
                       ("train.log_every", t.log_every),
                       ("train.keep_checkpoints", t.keep_checkpoints),
                       ("data.episodes_per_task", d.episodes_per_task),
                       ("data.image_size", d.image_size), ("data.max_steps", d.max_steps),
                       ("data.workers", d.workers), ("data.action_horizon", d.action_horizon),
                       ("data.max_instruction_len", d.max_instruction_len),
                       ("action_tokenizer.n_bins", cfg.action_tokenizer.n_bins),
                       ("action_tokenizer.vocab_size", cfg.action_tokenizer.vocab_size),
                       ("eval.episodes", e.episodes), ("eval.max_steps", e.max_steps),
                       ("parallel.dp", cfg.parallel.dp),
                       ("memory.recompute_every", cfg.memory.recompute_every),
                       ("parallel.micro_batch", cfg.parallel.micro_batch),
                       ("parallel.grad_accum", cfg.parallel.grad_accum),
                       ("parallel.tune_top", cfg.parallel.tune_top), ("parallel.tune_steps", cfg.parallel.tune_steps)]:
        _require(value >= 1, where, key, "an integer >= 1", value)
    _require(cfg.parallel.tune == "predict" or cfg.parallel.plan == "auto", where, "parallel.tune",
             '"predict" with parallel.plan = "manual" (measuring chooses among the auto-tuner\'s plans)',
             cfg.parallel.tune)
    _require(t.lr > 0, where, "train.lr", "a number > 0", t.lr)
    _require(cfg.action_tokenizer.scale > 0, where, "action_tokenizer.scale", "a number > 0",
             cfg.action_tokenizer.scale)
    _require(0 <= cfg.action_tokenizer.max_clipped_fraction <= 1, where, "action_tokenizer.max_clipped_fraction",
             "a number in [0, 1]", cfg.action_tokenizer.max_clipped_fraction)
    _require(cfg.action_tokenizer.max_action_tokens >= 0, where, "action_tokenizer.max_action_tokens",
             "an integer >= 0 (0 = from the data)", cfg.action_tokenizer.max_action_tokens)
    _require(cfg.memory.recompute != "auto" or cfg.memory.budget_gib > 0, where, "memory.budget_gib",
             'a number > 0 with memory.recompute = "auto"', cfg.memory.budget_gib)
    _require(cfg.memory.budget_gib >= 0, where, "memory.budget_gib", "a number >= 0", cfg.memory.budget_gib)
    _require(0 <= t.min_lr_ratio <= 1, where, "train.min_lr_ratio", "a number in [0, 1]",
             t.min_lr_ratio)
    _require(t.warmup_steps >= 0, where, "train.warmup_steps", "an integer >= 0", t.warmup_steps)
    _require(t.ckpt_every >= 0, where, "train.ckpt_every", "an integer >= 0 (0 = no checkpoints)", t.ckpt_every)
    _require(t.ckpt_every > 0 or t.on_nonfinite != "rollback", where, "train.ckpt_every",
             'an integer >= 1 with train.on_nonfinite = "rollback" (it reloads a checkpoint)', t.ckpt_every)
    _require(t.grad_clip >= 0, where, "train.grad_clip", "a number >= 0", t.grad_clip)
    p = t.profile_steps
    _require(not p or (len(p) == 2 and 1 <= p[0] <= p[1]), where, "train.profile_steps",
             "[] or [first, last] with 1 <= first <= last", p)
    _require(not p or p[1] <= t.steps, where, "train.profile_steps",
             f"a window that ends by train.steps = {t.steps}", p)
    _require(t.hang_timeout_s >= 0, where, "train.hang_timeout_s", "a number >= 0 (0 disables)", t.hang_timeout_s)
    _require(cfg.run.threads >= 0, where, "run.threads", "an integer >= 0", cfg.run.threads)
    for key, value in [("run.seed", cfg.run.seed), ("data.seed", d.seed), ("eval.seed", e.seed),
                       ("train.weight_decay", t.weight_decay)]:
        _require(value >= 0, where, key, "a value >= 0", value)
    _require(t.warmup_steps <= t.steps, where, "train.warmup_steps", f"at most train.steps ({t.steps})",
             t.warmup_steps)
    name = cfg.run.name
    _require(bool(name) and not name.startswith("-") and "/" not in name and "\\" not in name,
             where, "run.name", "a non-empty folder name without '/' that does not start with '-'", name)
    _require(d.action_horizon <= d.max_steps, where, "data.action_horizon",
             f"at most data.max_steps ({d.max_steps})", d.action_horizon)
    if check_paths and d.source == "lerobot" and not (Path(d.path) / "meta" / "info.json").is_file():
        raise ConfigError(f"{where}: data.path: no LeRobot dataset at '{d.path}' "
                          f"(expected {Path(d.path) / 'meta' / 'info.json'})")
    _require(len(d.tasks) > 0, where, "data.tasks", "at least one task", d.tasks)
    _require(ALL_TASKS not in d.tasks or (d.tasks == [ALL_TASKS] and d.source == "lerobot"), where, "data.tasks",
             "['*'] alone, with data.source = 'lerobot' (every task of the dataset), or task names", d.tasks)
    _require(e.seed != d.seed, where, "eval.seed",
             "a seed other than data.seed (evaluation goals must differ from training goals)", e.seed)
    _check_tasks(cfg, where)
    _check_model(cfg, where)  # last: the only check that imports torch
    return cfg


def _check_tasks(cfg: Config, where: str) -> None:
    if cfg.data.source != "metaworld":
        return
    from lf_data import METAWORLD_INSTRUCTIONS  # light: no simulator or torch import

    unknown = [t for t in cfg.data.tasks if t not in METAWORLD_INSTRUCTIONS]
    if unknown:
        near = [k for k in METAWORLD_INSTRUCTIONS if k.split("-")[0] == unknown[0].split("-")[0]]
        hint = (f"; did you mean {near[0]!r}?" if near
                else "; expected a Meta-World v3 task name such as 'reach-v3' or 'push-v3'")
        raise ConfigError(f"{where}: data.tasks: unknown Meta-World task {unknown[0]!r}{hint}")


def _check_model(cfg: Config, where: str) -> None:
    """Build the recipe config (no torch) so bad sizes and overrides fail before any work."""
    import msgspec as _msgspec

    from lf_orchestrator.families import FAMILY_RECIPES, check_family

    m = cfg.model
    if m.recipe in FAMILY_RECIPES:
        return check_family(cfg, where)
    if m.recipe == "vla_flow":
        from lf_ir import VLAFlowConfig as RecipeConfig
        from lf_ir.recipes.vla_flow import SIZES, build_graph
    else:
        from lf_ir.recipes.vla import SIZES, build_graph
        from lf_ir.recipes.vla import VLAConfig as RecipeConfig
    if m.size not in SIZES:
        raise ConfigError(f"{where}: model.size: expected one of {sorted(SIZES)}, got {m.size!r} "
                          f"(sizes of recipe {m.recipe!r})")
    from lf_orchestrator.families.recipes import OverrideError, recipe_overrides

    try:
        overrides = recipe_overrides(RecipeConfig, m.overrides, m.recipe)
    except OverrideError as err:
        raise ConfigError(f"{where}: {err}") from None
    if m.recipe == "vla" and "action_tokens" in m.overrides:
        raise ConfigError(f"{where}: model.overrides: 'action_tokens' is set by the action tokenizer "
                          f"(binning: horizon x dims; FAST: action_tokenizer.max_action_tokens + 1); remove it")
    try:
        build_graph(RecipeConfig(**{**SIZES[m.size], **overrides}))
    except (ValueError, TypeError, _msgspec.ValidationError) as err:
        raise ConfigError(f"{where}: model: {err}") from None
