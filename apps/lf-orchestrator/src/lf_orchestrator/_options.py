"""Command-line options shared by the `lf` commands that read a run config: one definition, one meaning.

``--set section.key=value`` (repeatable) overrides a value of the config after the file is read, exactly as
:func:`lf_orchestrator.config.load_config` applies it for every command (`lf run`, `lf launch`, `lf plan`,
`lf memory`, `lf config show`): the value is TOML (a bare word is a string), unknown keys and bad values are
refused naming the key. `lf eval RUN` and `lf sample RUN` take it too, for the keys that do not change the trained
model (:data:`EVAL_KEYS`, :data:`SAMPLE_KEYS`; :func:`load_trained_run`), applied in memory: the run's
``config.toml`` is never rewritten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", metavar="SECTION.KEY=VALUE",
    help="Override a config value: section.key=value (a TOML value; a bare word is a string). Repeatable.")]

EVAL_KEYS = ("eval.episodes", "eval.max_steps", "eval.seed", "eval.random_baseline", "run.device", "run.threads")
"""Keys ``lf eval RUN --set`` may change: how the trained policy is evaluated, not what was trained."""
SAMPLE_KEYS = ("video.frames", "video.sample_steps", "video.guidance", "video.shift", "run.threads")
"""Keys ``lf sample RUN --set`` may change: how the trained DiT is sampled (``lf sample`` runs on the CPU, so
``run.device`` is not one of them)."""


def set_keys(overrides: Optional[list[str]]) -> set[str]:
    """The dotted keys of ``--set KEY=VALUE`` overrides."""
    return {item.partition("=")[0].strip() for item in overrides or []}


def load_trained_run(run_dir: Path, overrides: Optional[list[str]], allowed: tuple[str, ...], command: str,
                     options: Optional[dict[str, tuple[str, Any]]] = None, hint: str = ""):
    """``run_dir/config.toml`` with the ``--set`` overrides applied in memory (the file is not rewritten), for a
    command that uses an already trained run (`lf eval`, `lf sample`).

    ``allowed``: the keys the overrides may change (:data:`EVAL_KEYS`, :data:`SAMPLE_KEYS`); ``options``: for each
    key that an explicit option of the command also sets, ``(option name, its value)``, None when not given;
    ``hint``: a sentence that ends a refusal.

    Raises:
        ConfigError: a key outside ``allowed`` (named, with the allowed keys; a misspelled key with the closest valid
            one), a key given both by ``--set`` and by its option, or the config's own errors (file, key, value).
    """
    from lf_orchestrator.config import ConfigError, check_override_keys, load_config

    check_override_keys(overrides, allowed, command,
                        "for a trained run (the run's checkpoint and data fix it; train another run to change it)",
                        hint)
    given = set_keys(overrides)
    for key, (option, value) in (options or {}).items():
        if value is not None and key in given:
            raise ConfigError(f"{command}: --set {key} and {option} both set {key}; give one of them")
    return load_config(run_dir / "config.toml", overrides)


def load_with_overrides(config: Optional[Path], overrides: Optional[list[str]], *, recipe: Optional[str] = None,
                        check_paths: bool = False):
    """The run config of a planning command (`lf plan`, `lf memory`): ``config`` with the ``--set`` overrides;
    without ``config`` but with overrides, the embedded default (as `lf run` reads it); None when neither is given
    (the command sizes a model from ``--recipe`` / ``--size``).

    Raises:
        ConfigError: from the file or the overrides, or ``--set`` with ``--recipe`` and no ``config`` (there is no
            config to override).
    """
    from lf_orchestrator.config import ConfigError, load_config

    if config is None and not overrides:
        return None
    if config is None and recipe is not None:
        raise ConfigError(f"--set {overrides[0]}: --set changes a run CONFIG's values; with --recipe there is none "
                          "(give the CONFIG, or drop --recipe to plan the embedded default config)")
    return load_config(config, overrides, check_paths=check_paths)
