"""A behaviour-cloning MLP baseline for a Meta-World VLA run (``lf eval RUN --baseline bc-mlp``).

The MLP sees what an MLP can use well of the VLA's observation: the standardized
39-d state (the run's own state mean/std) and a one-hot of the task (the
instruction's index in the dataset's task list); no image, no instruction words.
It predicts the whole normalized action chunk ``(horizon, action_dim)`` in one
shot, trained with a mean-squared error over the real (not padded) steps, in the
VLA run's action normalization: the dataset mean/std z-score for a ``vla_flow``
run, the binning tokenizer's [-1, 1] bounds (``q01_q99`` / ``min_max``) for a
token ``vla`` run. It trains on the run's dataset for the VLA's training budget
(:data:`BC_BUDGETS`): by default as many optimizer steps at the same batch size as
the VLA (``summary.json`` ``steps``, ``train.global_batch``), else the same
wall-clock time (``summary.json`` ``seconds``), then acts through
:func:`lf_orchestrator.families.vla.evaluate.rollout` like the VLA and the random policy
(the behaviour-cloning baseline of Mandlekar et al., "What Matters in Learning
from Offline Human Demonstrations for Robot Manipulation", CoRL 2021, without images).

Written to ``RUN/bc_mlp/``: ``model.safetensors``, ``bc_mlp.json`` (sizes,
normalization, training time, steps and the loss curve).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lf_data import LeRobotDataset
from lf_orchestrator._atomic import atomic_path
from lf_orchestrator.checkpoint import write_text_atomic
from lf_orchestrator.config import Config, load_config
from lf_orchestrator.families._metaworld import dataset_selection
from lf_orchestrator.families.vla import assembly
from lf_orchestrator.progress import format_eta

BASELINES = ("bc-mlp",)
"""Names accepted by ``lf eval --baseline``."""

BC_DIR = "bc_mlp"

BC_BUDGETS = {
    "steps": "the BC MLP took as many optimizer steps as the VLA at the VLA's global batch (the same number of "
             "training samples drawn), whatever hardware either trained on",
    "time": "the BC MLP trained for the VLA's training wall-clock time, on the machine that runs the evaluation "
            "(a like-for-like budget only when the VLA trained on the same hardware)",
}
"""``lf eval --bc-budget`` rules and the sentence each writes into the records (``budget_rule``). ``steps`` is the
default: a VLA trained on a GPU and a BC MLP trained on the evaluating CPU have wall-clock times that measure the
hardware, not the method; equal optimizer steps and batch size do not depend on it."""


class BCMLP(nn.Module):
    """State + task one-hot -> normalized action chunk.

    Args:
        state_dim: ``S``. n_tasks: ``T`` (one-hot width). action_dim: ``A``. horizon: ``H``.
        hidden: width of the ``layers`` hidden layers (GELU, LayerNorm before each activation).

    Shapes: ``forward(state (n, S) float32 standardized, task_onehot (n, T) float32) -> (n, H, A)``.
    """

    def __init__(self, state_dim: int, n_tasks: int, action_dim: int, horizon: int, *, hidden: int = 256,
                 layers: int = 3):
        super().__init__()
        self.sizes = {"state_dim": state_dim, "n_tasks": n_tasks, "action_dim": action_dim, "horizon": horizon,
                      "hidden": hidden, "layers": layers}
        mods: list[nn.Module] = []
        width = state_dim + n_tasks
        for _ in range(layers):
            mods += [nn.Linear(width, hidden), nn.LayerNorm(hidden), nn.GELU()]
            width = hidden
        mods.append(nn.Linear(width, horizon * action_dim))
        self.net = nn.Sequential(*mods)
        self.horizon, self.action_dim = horizon, action_dim

    def forward(self, state: torch.Tensor, task_onehot: torch.Tensor) -> torch.Tensor:
        out = self.net(torch.cat([state, task_onehot], dim=-1))
        return out.view(-1, self.horizon, self.action_dim)


class ActionNormalizer:
    """The VLA run's action normalization: z-score (``vla_flow``) or tokenizer bounds to [-1, 1] (``vla``)."""

    def __init__(self, encoder: Any):
        self.encoder = encoder
        self.kind = "mean_std" if hasattr(encoder, "action_mean") else "bounds"
        # FAST encoders keep their bounds apart from the tokenizer (``action_bounds``); binning's is the tokenizer
        self._bounds = getattr(encoder, "action_bounds", getattr(encoder, "action_tokenizer", None))

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        """Actions (..., A) in action units -> float32 normalized units."""
        if self.kind == "mean_std":
            return ((actions - self.encoder.action_mean) / self.encoder.action_std).astype(np.float32)
        return self._bounds.normalize(actions).astype(np.float32)

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        """Normalized (..., A) -> float64 action units."""
        if self.kind == "mean_std":
            return normalized.astype(np.float64) * self.encoder.action_std + self.encoder.action_mean
        return self._bounds.unnormalize(np.clip(normalized, -1.0, 1.0))


def _arrays(dataset: LeRobotDataset, encoder: Any, norm: ActionNormalizer) -> dict[str, torch.Tensor]:
    """Every frame's standardized state, task index, normalized action chunk and real-step mask."""
    samples = [dataset[i] for i in range(len(dataset))]
    states = np.stack([s["state"].numpy() for s in samples])
    actions = np.stack([s["actions"].numpy() for s in samples])  # (N, H, A)
    return {"state": torch.from_numpy((states - encoder.state_mean) / encoder.state_std).float(),
            "task": torch.tensor([s["task_index"] for s in samples]),
            "actions": torch.from_numpy(norm.normalize(actions)),
            "mask": ~torch.from_numpy(np.stack([s["action_is_pad"].numpy() for s in samples]))}


def vla_train_seconds(run_dir: Path) -> float:
    """The VLA run's training wall-clock time in seconds (``summary.json`` ``seconds``).

    Raises:
        FileNotFoundError: the run has no ``summary.json`` (it did not finish training).
        ValueError: ``summary.json`` without a positive ``seconds``.
    """
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"run folder {run_dir}: no summary.json (the VLA run did not finish training), "
                                f"so the BC MLP's training time is unknown")
    seconds = json.loads(path.read_text()).get("seconds")
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise ValueError(f"{path}: field 'seconds' must be a positive number, got {seconds!r}")
    return float(seconds)


def vla_train_steps(run_dir: Path) -> int:
    """The VLA run's optimizer steps (``summary.json`` ``steps``: all steps, also those of earlier sessions).

    Raises:
        FileNotFoundError: the run has no ``summary.json`` (it did not finish training).
        ValueError: ``summary.json`` without a positive integer ``steps``.
    """
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"run folder {run_dir}: no summary.json (the VLA run did not finish training), "
                                f"so the BC MLP's training steps are unknown")
    steps = json.loads(path.read_text()).get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise ValueError(f"{path}: field 'steps' must be a positive integer, got {steps!r}")
    return steps


def train_bc_mlp(run_dir: Path, *, budget: str = "steps", seconds: float | None = None, steps: int | None = None,
                 cfg: Config | None = None, batch_size: int | None = None, lr: float = 1e-3, log_every: int = 50,
                 min_steps: int = 0, report: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train the BC MLP on the run's dataset for the VLA's training budget; save it.

    ``budget`` (:data:`BC_BUDGETS`): ``steps`` trains ``steps`` optimizer steps (default: the VLA's,
    ``summary.json`` ``steps``); ``time`` trains ``seconds`` of wall-clock time (default: the VLA's,
    ``summary.json`` ``seconds``). Giving ``seconds`` selects ``time``, giving ``steps`` selects ``steps``.
    Same data (``data.path``, ``data.action_horizon``), same state/action normalization as the
    run's encoder, batch ``train.global_batch`` samples drawn with replacement (seed ``run.seed``),
    AdamW at constant ``lr``. Returns (and writes to ``RUN/bc_mlp/bc_mlp.json``) the record:
    ``budget`` and ``budget_rule`` (the rule and its sentence), ``seconds`` (trained), ``vla_seconds``
    (``time``: the budget; ``steps``: the VLA's recorded time, or None), ``vla_steps`` (``steps``: the budget),
    ``steps``, ``batch_size``, ``parameters``, ``loss_curve`` [[step, loss], ...] (mean over ``log_every``
    steps), ``loss_first`` / ``loss_last``. ``min_steps`` > 0 trains at least that many steps whatever the
    time (``time`` budget: tests on a loaded machine; `lf eval` leaves it 0). ``report`` receives a progress line
    (step, loss, time left) about every tenth of the budget.

    Raises:
        ValueError: an unknown ``budget``, both ``seconds`` and ``steps``, or a non-positive one.
        FileNotFoundError: no ``summary.json`` (when the budget comes from it), encoder or dataset files.
    """
    run_dir = Path(run_dir)
    if seconds is not None and steps is not None:
        raise ValueError(f"train_bc_mlp: give seconds ({seconds}) or steps ({steps}), not both")
    budget = "time" if seconds is not None else "steps" if steps is not None else budget
    if budget not in BC_BUDGETS:
        raise ValueError(f"--bc-budget: unknown rule {budget!r} (known: {', '.join(BC_BUDGETS)})")
    if (seconds is not None and not seconds > 0) or (steps is not None and steps < 1):
        raise ValueError(f"train_bc_mlp: the budget must be positive, got seconds={seconds}, steps={steps}")
    cfg = cfg or load_config(run_dir / "config.toml")
    vla_steps = None
    if budget == "time":
        vla_seconds = vla_train_seconds(run_dir) if seconds is None else float(seconds)
    else:
        vla_steps = vla_train_steps(run_dir) if steps is None else int(steps)
        summary = run_dir / "summary.json"  # the VLA's time, for the record only
        vla_seconds = json.loads(summary.read_text()).get("seconds") if summary.is_file() else None
    encoder = assembly.load_encoder(cfg, run_dir)
    norm = ActionNormalizer(encoder)
    dataset = LeRobotDataset(cfg.data.path, action_horizon=cfg.data.action_horizon, **dataset_selection(cfg))
    data = _arrays(dataset, encoder, norm)
    n_tasks, (_, horizon, action_dim) = len(dataset.tasks), data["actions"].shape
    torch.manual_seed(cfg.run.seed)
    model = BCMLP(data["state"].shape[1], n_tasks, action_dim, horizon)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(cfg.run.seed)
    batch_size = batch_size or cfg.train.global_batch
    onehot = torch.eye(n_tasks)
    curve, window, step, t0 = [], [], 0, time.perf_counter()
    tenth = 0  # of the budget reported so far
    while True:
        idx = torch.randint(0, len(dataset), (batch_size,), generator=gen)
        mask = data["mask"][idx].unsqueeze(-1).float()  # (b, H, 1)
        pred = model(data["state"][idx], onehot[data["task"][idx]])
        loss = (((pred - data["actions"][idx]) ** 2) * mask).sum() / (mask.sum() * action_dim).clamp_min(1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        window.append(loss.item())
        if len(window) == log_every:
            curve.append([step, float(np.mean(window))])
            window = []
        done = step >= vla_steps if budget == "steps" else \
            step >= min_steps and time.perf_counter() - t0 >= vla_seconds
        if report is not None:
            elapsed = time.perf_counter() - t0
            frac = step / vla_steps if budget == "steps" else elapsed / vla_seconds
            if done or int(10 * frac) > tenth:
                tenth = int(10 * frac)
                of = f"/{vla_steps}" if budget == "steps" else f" ({elapsed:.0f}/{vla_seconds:.0f} s)"
                report(f"bc-mlp step {step}{of} loss {loss.item():.4f} "
                       f"ETA {format_eta(0.0 if done else elapsed / max(frac, 1e-9) - elapsed)}")
        if done:
            break
    if window:
        curve.append([step, float(np.mean(window))])
    record = {"budget": budget, "budget_rule": BC_BUDGETS[budget], "seconds": time.perf_counter() - t0,
              "vla_seconds": vla_seconds, "vla_steps": vla_steps, "steps": step,
              "batch_size": batch_size, "lr": lr, "parameters": sum(p.numel() for p in model.parameters()),
              "sizes": model.sizes, "tasks": list(dataset.tasks), "normalization": norm.kind,
              "loss_first": curve[0][1], "loss_last": curve[-1][1], "loss_curve": curve}
    out = run_dir / BC_DIR
    out.mkdir(exist_ok=True)
    with atomic_path(out / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    write_text_atomic(out / "bc_mlp.json", json.dumps(record, indent=1))
    return record


class BCMLPPolicy:
    """A trained BC MLP as an evaluation policy (:class:`lf_orchestrator.families.vla.evaluate.Policy`); no images."""

    def __init__(self, model: BCMLP, encoder: Any, tasks: Sequence[str]):
        self.model, self.encoder, self.norm = model.eval(), encoder, ActionNormalizer(encoder)
        self.task_index = {t: i for i, t in enumerate(tasks)}
        self.horizon, self.needs_images = model.horizon, False

    @classmethod
    def from_run(cls, run_dir: Path, cfg: Config | None = None) -> BCMLPPolicy:
        """Load ``RUN/bc_mlp/`` and the run's encoder (FileNotFoundError naming the missing file)."""
        run_dir = Path(run_dir)
        cfg = cfg or load_config(run_dir / "config.toml")
        for name in ("bc_mlp.json", "model.safetensors"):
            if not (run_dir / BC_DIR / name).is_file():
                raise FileNotFoundError(f"run folder {run_dir}: missing {BC_DIR}/{name} (train it with "
                                        f"`lf eval {run_dir} --baseline bc-mlp`)")
        record = json.loads((run_dir / BC_DIR / "bc_mlp.json").read_text())
        s = record["sizes"]
        model = BCMLP(s["state_dim"], s["n_tasks"], s["action_dim"], s["horizon"], hidden=s["hidden"],
                      layers=s["layers"])
        model.load_state_dict(load_file(str(run_dir / BC_DIR / "model.safetensors")))
        return cls(model, assembly.load_encoder(cfg, run_dir), record["tasks"])

    @torch.no_grad()
    def act(self, images: np.ndarray, states: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """Action chunks float64 (n, horizon, action_dim) in action units.

        Raises:
            ValueError: an instruction that is not one of the training tasks.
        """
        unknown = [t for t in texts if t not in self.task_index]
        if unknown:
            raise ValueError(f"BC MLP: instruction {unknown[0]!r} is not one of its training tasks "
                             f"{sorted(self.task_index)}")
        state = (np.asarray(states, dtype=np.float32) - self.encoder.state_mean) / self.encoder.state_std
        onehot = torch.eye(len(self.task_index))[[self.task_index[t] for t in texts]]
        out = self.model(torch.from_numpy(state.astype(np.float32)), onehot)
        return self.norm.unnormalize(out.numpy())
