"""Run metrics: JSON lines, TensorBoard scalars and the loss-curve PNG.

On resume the logger drops records after the checkpoint's step (they were
written by the interrupted run and will be produced again) and TensorBoard is
opened with ``purge_step`` so its curves continue without a duplicate tail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lf_orchestrator._atomic import atomic_path

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss_curve.png"


class MetricsLogger:
    """Appends scalars for rank 0; other ranks get a logger that writes nothing."""

    def __init__(self, run_dir: Path, *, start_step: int, enabled: bool = True):
        self.run_dir, self.enabled = Path(run_dir), enabled
        self.path = self.run_dir / METRICS_FILE
        self._tb = None
        if not enabled:
            return
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= start_step]
            self.path.write_text("".join(f"{line}\n" for line in kept))
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=start_step + 1)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Record ``scalars`` at ``step`` (JSON line and TensorBoard)."""
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **scalars}) + "\n")
        for key, value in scalars.items():
            self._tb.add_scalar(key, value, step)
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All metric records of a run, in step order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_loss_curve(run_dir: Path, ylabel: str = "training loss", *, out: Path | None = None,
                    title: str | None = None) -> Path | None:
    """Write the training loss against step (log y axis labelled ``ylabel``) of ``run_dir``'s metrics as a PNG.

    Args:
        run_dir: the run folder (its ``metrics.jsonl``).
        ylabel: the y axis label (what the loss is).
        out: the PNG to write; default ``run_dir/loss_curve.png``.
        title: the plot title; default the run folder's name.

    Returns:
        The PNG's path, or None when there is no ``train/loss`` record or matplotlib is not installed (the numbers
        stay in ``metrics.jsonl``; a training run does not fail for want of a plot).
    """
    records = [r for r in read_metrics(run_dir) if "train/loss" in r]
    if not records:
        return None
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([r["step"] for r in records], [r["train/loss"] for r in records], lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    ax.set_title(title if title is not None else Path(run_dir).name)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out) if out is not None else Path(run_dir) / CURVE_FILE
    try:
        with atomic_path(out) as tmp:  # a unique temporary: two writers never share one
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return out
