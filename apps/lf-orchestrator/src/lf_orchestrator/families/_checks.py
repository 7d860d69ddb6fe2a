"""Cheap checks of the family sections, run by ``load_config`` before any work."""

from __future__ import annotations

from typing import Any

import msgspec

from lf_orchestrator.families.recipes import recipe_config


def _fail(where: str, key: str, expected: str, got: Any):
    from lf_orchestrator.config import ConfigError

    raise ConfigError(f"{where}: {key}: expected {expected}, got {got!r}")


def check_family_config(cfg, where: str) -> None:
    """Recipe size/overrides, the family section and the LoRA / plan fields; ConfigError naming the key."""
    from lf_orchestrator.config import ConfigError

    m = cfg.model
    from lf_orchestrator.families.recipes import OverrideError

    try:
        rcfg, graph = recipe_config(m.recipe, m.size, m.overrides)
    except OverrideError as err:
        raise ConfigError(f"{where}: {err}") from None
    except (ValueError, TypeError, msgspec.ValidationError) as err:
        raise ConfigError(f"{where}: model: {err}") from None
    check_train_plan_fields(cfg, where)
    from lf_ir import recipe_spec

    family = recipe_spec(m.recipe, where="model.recipe").family
    if family == "llm":
        c = cfg.corpus
        for key, value, low in (("corpus.max_chars", c.max_chars, 1000), ("corpus.seq_len", c.seq_len, 8),
                                ("corpus.min_chars", c.min_chars, 1)):
            if value < low:
                _fail(where, key, f"an integer >= {low}", value)
        if not 0 < c.eval_fraction < 0.5:
            _fail(where, "corpus.eval_fraction", "a number in (0, 0.5)", c.eval_fraction)
        if c.seq_len > rcfg.max_seq_len:
            _fail(where, "corpus.seq_len", f"at most the model's max_seq_len ({rcfg.max_seq_len})", c.seq_len)
        if rcfg.vocab_size < 300:
            _fail(where, "model.overrides.vocab_size", "at least 300 (256 byte tokens + merges + specials)",
                  rcfg.vocab_size)
    elif family == "vlm":
        v, side = cfg.vlm, rcfg.patch_size * rcfg.spatial_merge_size
        if v.image_size < side or v.image_size % side:
            _fail(where, "vlm.image_size", f"a positive multiple of patch_size * spatial_merge_size ({side})",
                  v.image_size)
        if v.frame_stride < 1:
            _fail(where, "vlm.frame_stride", "an integer >= 1", v.frame_stride)
        if not 0 < v.eval_fraction < 1:
            _fail(where, "vlm.eval_fraction", "a number in (0, 1)", v.eval_fraction)
    elif family == "video":
        _check_video(cfg, rcfg, where)
    elif family == "video_vae":
        _check_vae(cfg, rcfg, where)


def _check_clips(cfg, vae, where: str) -> None:
    """``video.frames`` / ``video.clip_stride`` against the VAE's causal layout and the episodes."""
    v = cfg.video
    if v.frames < 1 or (v.frames - 1) % vae.temporal_factor:
        _fail(where, "video.frames", f"1 + {vae.temporal_factor} * k (the VAE's causal frame layout)", v.frames)
    if v.clip_stride < 1:
        _fail(where, "video.clip_stride", "an integer >= 1", v.clip_stride)


def _check_vae(cfg, vae, where: str) -> None:
    """The wan_vae recipe (video_vae family): clips of ``data.image_size`` and the ``[vae]`` section."""
    _check_clips(cfg, vae, where)
    if cfg.video.frames > cfg.data.max_steps:
        _fail(where, "video.frames", f"at most data.max_steps ({cfg.data.max_steps})", cfg.video.frames)
    if cfg.data.image_size % vae.spatial_factor:
        _fail(where, "data.image_size", f"a multiple of {vae.spatial_factor} (the VAE's stride)", cfg.data.image_size)
    a = cfg.vae
    if not a.kl_weight >= 0:
        _fail(where, "vae.kl_weight", "a number >= 0", a.kl_weight)
    if not 0 < a.eval_fraction < 1:
        _fail(where, "vae.eval_fraction", "a number in (0, 1)", a.eval_fraction)
    if a.eval_clips < 1:
        _fail(where, "vae.eval_clips", "an integer >= 1", a.eval_clips)


def _video_vae_config(v, where: str):
    """The VAE config a video run encodes with: the wan_vae run's when ``video.vae_weights`` names an existing
    run folder (its ``model.size`` must be ``video.vae_size``), else ``video.vae_size``'s."""
    from lf_ir import recipe_spec
    from lf_orchestrator.families._vae_run import is_vae_run, run_vae_config

    spec = recipe_spec("wan_vae")
    try:
        vae_size = spec.size_name(v.vae_size, where="video.vae_size")
    except ValueError as err:
        from lf_orchestrator.config import ConfigError

        raise ConfigError(f"{where}: {err}") from None
    if not is_vae_run(v.vae_weights):
        return spec.config(vae_size)
    try:
        size, vae = run_vae_config(v.vae_weights)
    except (FileNotFoundError, ValueError, TypeError, msgspec.ValidationError) as err:
        from lf_orchestrator.config import ConfigError

        raise ConfigError(f"{where}: {err}") from None
    if spec.size_name(size) != vae_size:
        _fail(where, "video.vae_size", f"the model.size of the wan_vae run {v.vae_weights} ({size!r})", v.vae_size)
    return vae


def _check_video(cfg, rcfg, where: str) -> None:
    v = cfg.video
    vae = _video_vae_config(v, where)
    _check_clips(cfg, vae, where)
    side = vae.spatial_factor * rcfg.patch[1]
    if v.latents == "synthetic":
        for key, value in (("video.height", v.height), ("video.width", v.width)):
            if value < side or value % side:
                _fail(where, key, f"a positive multiple of {side} (VAE stride x patch)", value)
        if v.synthetic_clips < 1:
            _fail(where, "video.synthetic_clips", "an integer >= 1", v.synthetic_clips)
        if cfg.data.tasks == ["*"]:
            _fail(where, "data.tasks", "task names (synthetic clips are labelled with their instructions; no "
                  "dataset to take every task from)", cfg.data.tasks)
    else:
        if v.frames > cfg.data.max_steps:
            _fail(where, "video.frames", f"at most data.max_steps ({cfg.data.max_steps})", v.frames)
        if cfg.data.image_size % side:
            _fail(where, "data.image_size", f"a multiple of {side} (VAE stride x patch)", cfg.data.image_size)
    if vae.z_dim != rcfg.in_channels:
        _fail(where, "model.overrides.in_channels", f"the VAE's z_dim ({vae.z_dim})", rcfg.in_channels)
    if v.clip_stride < 1 or v.sample_steps < 1:
        _fail(where, "video.clip_stride / video.sample_steps", "integers >= 1", (v.clip_stride, v.sample_steps))
    if not 0 <= v.cfg_dropout < 1:
        _fail(where, "video.cfg_dropout", "a number in [0, 1)", v.cfg_dropout)
    if not v.shift > 0:
        _fail(where, "video.shift", "a number > 0", v.shift)


def check_train_plan_fields(cfg, where: str) -> None:
    """The LoRA fields and ``parallel.spec`` (parsed; context parallel only where the recipe has it), for every
    family; ConfigError naming the key."""
    from lf_orchestrator.config import ConfigError

    t, m = cfg.train, cfg.model
    if t.lora_rank < 0:
        _fail(where, "train.lora_rank", "an integer >= 0 (0 = off)", t.lora_rank)
    if t.lora_rank and not t.lora_targets:
        _fail(where, "train.lora_targets", "at least one pattern with train.lora_rank > 0", t.lora_targets)
    if cfg.parallel.spec:
        from lf_orchestrator.families._context import cp_unsupported, with_cp_kind
        from lf_parallel import PlanError, parse_plan

        if cfg.parallel.plan != "manual":
            _fail(where, "parallel.plan", '"manual" with parallel.spec', cfg.parallel.plan)
        try:
            plan = with_cp_kind(parse_plan(cfg.parallel.spec), cfg.parallel.spec, cfg.parallel.cp_kind)
        except PlanError as err:
            from lf_orchestrator._config_errors import explain_enum
            from lf_parallel import Plan

            raise ConfigError(f"{where}: parallel.spec: {explain_enum(str(err), Plan)}") from None
        why = cp_unsupported(plan, m.recipe)
        if why:
            raise ConfigError(f"{where}: parallel.spec = {cfg.parallel.spec!r}: {why}")

