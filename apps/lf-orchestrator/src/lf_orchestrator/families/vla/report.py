"""The closed-loop success table that `lf run` and `lf eval` print for a VLA run."""

from __future__ import annotations

from rich.table import Table

from lf_orchestrator._console import make_console


def print_eval(report: dict) -> None:
    """Print the success table of an evaluation report (:func:`.evaluate.evaluate_run`) to stdout: per task the
    episodes and the success rates (percent) of the VLA, the random policy and, when measured, the BC MLP."""
    table = Table(title="Closed-loop success (Meta-World)")
    bc = any("bc_mlp_success" in row for row in report["tasks"])
    for col in ("task", "episodes", "VLA", "random policy") + (("BC MLP",) if bc else ()):
        table.add_column(col, justify="right" if col != "task" else "left")

    def pct(value) -> str:
        return "-" if value is None else f"{100 * value:.0f}%"

    for row in report["tasks"]:
        cells = [row["task"], str(row["episodes"]), pct(row["vla_success"]), pct(row.get("random_success"))]
        table.add_row(*cells, *((pct(row.get("bc_mlp_success")),) if bc else ()))
    if "invalid_action_chunks" in report:  # FAST: sequences that decoded to no chunk (zero actions instead)
        chunks = sum(row.get("action_chunks", 0) for row in report["tasks"])
        table.caption = f"VLA action chunks that did not decode (zero actions instead): " \
                        f"{report['invalid_action_chunks']} of {chunks}"
    make_console().print(table)
