"""Run metrics: JSON lines, TensorBoard scalars and the loss-curve PNG.

On resume the logger drops records after the checkpoint's step (they were
written by the interrupted run and will be produced again) and TensorBoard is
opened with ``purge_step`` so its curves continue without a duplicate tail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def plot_loss_curve(run_dir: Path, ylabel: str = "training loss") -> Path | None:
    """Write ``loss_curve.png`` (training loss against step, y axis ``ylabel``) and return its path."""
    records = [r for r in read_metrics(run_dir) if "train/loss" in r]
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([r["step"] for r in records], [r["train/loss"] for r in records], lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    ax.set_title(Path(run_dir).name)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(run_dir) / CURVE_FILE
    tmp = out.with_name(".loss_curve.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out
