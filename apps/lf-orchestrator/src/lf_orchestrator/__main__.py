"""``python -m lf_orchestrator`` (what torchrun launches) runs the `lf` CLI."""

from lf_orchestrator.cli import app

app()
