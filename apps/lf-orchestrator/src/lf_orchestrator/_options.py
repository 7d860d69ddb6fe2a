"""Command-line options shared by the `lf` commands that read a run config: one definition, one meaning.

``--set section.key=value`` (repeatable) overrides a value of the config after the file is read, exactly as
:func:`lf_orchestrator.config.load_config` applies it for every command (`lf run`, `lf launch`, `lf plan`,
`lf memory`, `lf config show`): the value is TOML (a bare word is a string), unknown keys and bad values are
refused naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", metavar="SECTION.KEY=VALUE",
    help="Override a config value: section.key=value (a TOML value; a bare word is a string). Repeatable.")]


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
