"""lf-orchestrator: the `lf` command line of LoongForge.

Public API: :func:`load_config` and :class:`Config` (run configs), and the
Typer application ``app`` behind the ``lf`` command.
"""

__version__ = "0.10.0"

from lf_orchestrator.config import Config, ConfigError, load_config  # noqa: E402

__all__ = ["Config", "ConfigError", "__version__", "load_config"]
