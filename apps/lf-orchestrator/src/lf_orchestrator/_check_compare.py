"""The comparison of `lf parallel check`: two ``lf run`` folders, step by step and parameter by parameter.

The oracle is the single-process run of the same config through ``lf run`` (same seed, same global batch, same
micro-batch split): a plan is correct when its per-step losses and gradient norms (``metrics.jsonl``:
``train/loss``, ``train/grad_norm`` before clipping) and its parameters after the last step (the last DCP
checkpoint, read to full tensors on the CPU by :func:`lf_orchestrator.families._state.load_model_weights`, no
process group) equal the reference's within a relative tolerance.

Relative difference of a scalar: ``|a - b| / |b|``; of the parameters: the norm-wise relative difference of the
whole model in the 1-norm, ``sum|a - b| / sum|b|`` over every entry of every tensor (the table lists the tensors
with the largest per-tensor figure, to say where a difference is). Not element-wise, nor per tensor: AdamW divides
each update by ``sqrt(v) + eps``, so an entry whose gradient is a sum that nearly cancels (a rarely seen token's
embedding row; an attention key bias, whose exact gradient is zero) moves by up to about ``lr`` on float32
round-off alone, under any correct plan. Measured after 3 steps: the tiny llama3 under ``pp=2,grad_accum=2``,
losses and gradient norms within 1.1e-7, its largest tensor figure 7.5e-7 and 1.2e-4 element-wise
(``max|a - b| / max|b|``, printed for information); wan_dit under ``cp=2,zero=3``, a cross-attention key bias at
5.7e-6 per tensor. A real fault moves whole rows or tensors by the size of an update (about ``lr``): one embedding
row of the tiny llama3 left unchanged is about 1e-4 of the model's 1-norm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table


@dataclass
class Comparison:
    """Per-step scalars of both runs and the largest parameter differences (see the module docstring)."""

    steps: list[int]
    ref_loss: list[float]
    loss: list[float]
    ref_norm: list[float]
    norm: list[float]
    param_rel: dict[str, float] = field(default_factory=dict)
    """Relative difference per parameter tensor in the 1-norm, by name."""
    param_model_rel: float = 0.0
    """The whole model's relative difference in the 1-norm (what the check compares with its tolerance)."""
    param_max_rel: dict[str, float] = field(default_factory=dict)
    """Element-wise ``max|a - b| / max|b|`` per parameter tensor (information only, see the module docstring)."""
    missing: list[str] = field(default_factory=list)
    """What one run lacks that the other has (steps, tensors, shapes): each entry fails the check."""

    @staticmethod
    def _rel(a: float, b: float) -> float:
        return abs(a - b) / abs(b) if b else abs(a - b)

    @property
    def loss_rel(self) -> list[float]:
        return [self._rel(a, b) for a, b in zip(self.loss, self.ref_loss, strict=True)]

    @property
    def norm_rel(self) -> list[float]:
        return [self._rel(a, b) for a, b in zip(self.norm, self.ref_norm, strict=True)]

    def worst(self) -> float:
        """The largest relative difference of a loss, gradient norm or parameter (inf when something is
        missing)."""
        if self.missing:
            return float("inf")
        return max([0.0, *self.loss_rel, *self.norm_rel, self.param_model_rel])


def step_scalars(run_dir: Path) -> dict[int, dict[str, float]]:
    """``{step: {"train/loss": .., "train/grad_norm": ..}}`` of a run folder's ``metrics.jsonl`` (the last row of
    a step wins: a resumed run logs its steps again).

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` (names the path).
    """
    rows: dict[int, dict[str, float]] = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/loss" in row:
            rows[int(row["step"])] = {k: float(row[k]) for k in ("train/loss", "train/grad_norm") if k in row}
    return rows


def final_weights(run_dir: Path) -> dict:
    """The model's full weights (CPU, the recipe's own names) of the run's newest complete checkpoint.

    Raises:
        FileNotFoundError: the run has no complete checkpoint (names the folder).
    """
    from lf_orchestrator.checkpoint import latest_checkpoint
    from lf_orchestrator.families._state import load_model_weights

    ckpt = latest_checkpoint(Path(run_dir))
    if ckpt is None:
        raise FileNotFoundError(f"{Path(run_dir) / 'checkpoints'}: no complete checkpoint to compare")
    return load_model_weights(ckpt)


def compare_runs(ref_dir: Path, run_dir: Path, steps: int) -> Comparison:
    """Steps ``1..steps`` and the final parameters of ``run_dir`` against the reference run ``ref_dir``.

    A step or tensor that one run lacks, or a tensor whose shape differs, is listed in ``missing`` (and fails).
    """
    ref, got = step_scalars(ref_dir), step_scalars(run_dir)
    cmp = Comparison(steps=[], ref_loss=[], loss=[], ref_norm=[], norm=[])
    for step in range(1, steps + 1):
        a, b = got.get(step, {}), ref.get(step, {})
        if "train/loss" not in a or "train/loss" not in b or "train/grad_norm" not in a or "train/grad_norm" not in b:
            cmp.missing.append(f"step {step}: loss and gradient norm of "
                               f"{'the plan' if 'train/grad_norm' not in a else 'the reference'}")
            continue
        cmp.steps.append(step)
        cmp.loss.append(a["train/loss"])
        cmp.ref_loss.append(b["train/loss"])
        cmp.norm.append(a["train/grad_norm"])
        cmp.ref_norm.append(b["train/grad_norm"])
    ref_w, got_w = final_weights(ref_dir), final_weights(run_dir)
    cmp.missing += [f"parameter {k}: only in {where}" for k, where in
                    [*((k, "the reference") for k in sorted(set(ref_w) - set(got_w))),
                     *((k, "the plan's run") for k in sorted(set(got_w) - set(ref_w)))]]
    diff_sum = scale_sum = 0.0
    for name in sorted(set(ref_w) & set(got_w)):
        a, b = got_w[name].double(), ref_w[name].double()
        if a.shape != b.shape:
            cmp.missing.append(f"parameter {name}: shape {tuple(a.shape)}, reference {tuple(b.shape)}")
            continue
        diff = (a - b).abs()
        total, scale = float(diff.sum()), float(b.abs().sum())
        cmp.param_rel[name] = total / scale if scale else total
        diff_sum, scale_sum = diff_sum + total, scale_sum + scale
        peak = float(b.abs().max()) if b.numel() else 0.0
        cmp.param_max_rel[name] = (float(diff.max()) / peak if peak else float(diff.max())) if b.numel() else 0.0
    cmp.param_model_rel = diff_sum / scale_sum if scale_sum else diff_sum
    return cmp


def report(cmp: Comparison, *, title: str, grad_clip: float, top: int = 5) -> tuple[Table, list[str]]:
    """(a table of the per-step scalars and the ``top`` largest parameter differences, summary lines)."""
    table = Table(title=title)
    for col in ("", "one process", "plan", "relative difference"):
        table.add_column(col, justify="right" if col else "left")
    for i, step in enumerate(cmp.steps):
        table.add_row(f"step {step} loss", f"{cmp.ref_loss[i]:.6f}", f"{cmp.loss[i]:.6f}", f"{cmp.loss_rel[i]:.2e}")
        clipped = "" if cmp.ref_norm[i] > grad_clip else " (not clipped)"
        table.add_row(f"step {step} gradient norm{clipped}", f"{cmp.ref_norm[i]:.6f}", f"{cmp.norm[i]:.6f}",
                      f"{cmp.norm_rel[i]:.2e}")
    for name, rel in sorted(cmp.param_rel.items(), key=lambda kv: -kv[1])[:top]:
        table.add_row(f"parameter {name} (1-norm)", "", "", f"{rel:.2e}")
    table.add_row("parameters, whole model (1-norm)", "", "", f"{cmp.param_model_rel:.2e}")
    loss = max(cmp.loss_rel, default=0.0)
    norm = max(cmp.norm_rel, default=0.0)
    element = max(cmp.param_max_rel.items(), key=lambda kv: kv[1], default=("-", 0.0))
    lines = [f"max_rel_loss={loss:.3e} max_rel_grad_norm={norm:.3e} max_rel_param={cmp.param_model_rel:.3e}",
             f"(parameters: the model's 1-norm; not checked: per tensor up to "
             f"{max(cmp.param_rel.values(), default=0.0):.2e}, element-wise {element[1]:.2e} in {element[0]}: AdamW "
             f"moves entries whose gradient nearly cancels by float32 round-off)"]
    unclipped = [s for s, n in zip(cmp.steps, cmp.ref_norm, strict=True) if not n > grad_clip]
    if unclipped:
        lines.append(f"note: steps {unclipped} did not clip (gradient norm <= --grad-clip {grad_clip:g})")
    lines += [f"missing: {m}" for m in cmp.missing]
    return table, lines


def check_runs(ref_dir: Path, run_dir: Path, *, steps: int, tol: float, title: str, grad_clip: float) -> int:
    """Compare ``run_dir`` with the reference run ``ref_dir`` (:func:`compare_runs`), print the table and the
    summary to stdout, and return the exit status of `lf parallel check`: 0 when every loss, gradient norm and
    parameter is within ``tol`` (relative) and nothing is missing, else 1."""
    from lf_orchestrator._console import make_console

    cmp = compare_runs(ref_dir, run_dir, steps)
    table, lines = report(cmp, title=title, grad_clip=grad_clip)
    make_console().print(table)
    for line in lines:
        print(line)
    if cmp.worst() > tol:
        print(f"FAIL: differences exceed --tol {tol:g} (worst {cmp.worst():.2e})")
        return 1
    print("OK")
    return 0
