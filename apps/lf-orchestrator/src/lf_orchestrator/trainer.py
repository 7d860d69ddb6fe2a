"""The training loop of `lf run`: data -> encoder -> lowered model -> plan -> steps.

The order in which techniques are applied is written here once:
build on meta -> materialize -> activation recomputation (lf-memory) ->
data parallel (lf-parallel) -> optimizer. Losses are normalized by the number
of target tokens of the whole global batch (all micro-batches, all ranks), so
gradient accumulation and data parallelism give the gradient of one large batch.

The trainer knows no recipe: every model offers ``loss_normalizer(batch)`` (target
units: action tokens for ``vla``, action values for ``vla_flow``) and
``training_loss(batch) -> (loss summed over them, {metric: sum})``. Each batch
carries ``sample_seed`` (n,) from (run seed, step, dataset index), so a recipe
that draws noise (flow matching) draws the same for a sample however the step is
split over micro-batches and processes, and a resumed run repeats it exactly.

Checkpoints are the sharded DCP folders of the llm / vlm / video trainer
(:class:`lf_orchestrator.families._state.FamilyCheckpointer`, state as in
:mod:`lf_orchestrator.train_state`): every rank writes its shards of the model and
optimizer, with the schedule, loss scaler, each dp rank's sampler position, each
rank's RNG, the step and the plan; atomic, the newest ``train.keep_checkpoints``
kept, in the background with ``train.async_checkpoint``. A run resumes bit for bit
under its own plan and under another data-parallel size (DCP reshards; the data
position is dealt anew). Folders of the earlier full-state layout resume too
(under the world size that wrote them). The fit loop (logging window, checkpoint cadence, faults as in
:mod:`lf_orchestrator.families._faults`, final save, summary) is the recipe trainer's:
:func:`lf_orchestrator.fit.fit_loop`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lf_data import LeRobotDataset, ResumableSampler, generate_metaworld
from lf_ir.recipes.vla_flow import sample_seeds
from lf_memory import (
    DynamicLossScaler,
    RecomputePlan,
    apply_recompute,
    offload_activations,
    plan_recompute,
    resolve_precision,
)
from lf_orchestrator import assembly
from lf_orchestrator.checkpoint import is_legacy, latest_checkpoint, load_checkpoint
from lf_orchestrator.config import Config, ConfigError
from lf_orchestrator.families._faults import check_finite_weights, nonfinite_step
from lf_orchestrator.families._metaworld import dataset_selection
from lf_orchestrator.families._state import FamilyCheckpointer
from lf_orchestrator.faults import nonfinite_reason
from lf_orchestrator.fit import StepCallback, apply_update, check_enough_samples, fit_loop, lr_schedule
from lf_orchestrator.prefetch import make_prefetcher
from lf_orchestrator.train_state import restore_training_state, save_training_state
from lf_parallel import DistContext, Plan, apply_data_parallel, check_plan, choose_plan, clip_grad_norm_, global_sum


def prepare_dataset(cfg: Config, ctx: DistContext,
                    progress: Callable[[int, int], None] | None = None) -> LeRobotDataset:
    """Generate the Meta-World demonstrations on rank 0 if needed, then open the dataset (a ``lerobot`` one
    restricted to ``data.tasks`` and ``data.max_steps`` frames per episode:
    :func:`lf_orchestrator.families._metaworld.dataset_selection`)."""
    d = cfg.data
    if d.source == "metaworld" and ctx.is_main:
        generate_metaworld(d.path, tasks=d.tasks, episodes_per_task=d.episodes_per_task,
                           image_size=d.image_size, max_steps=d.max_steps, seed=d.seed,
                           workers=d.workers, progress=progress)
    if ctx.distributed:
        torch.distributed.barrier()
    return LeRobotDataset(d.path, action_horizon=d.action_horizon, **dataset_selection(cfg))


def make_plan(cfg: Config, ctx: DistContext) -> Plan:
    """The data-parallel plan: chosen (``auto``) or checked (``manual``)."""
    p = cfg.parallel
    if p.plan == "auto":
        return choose_plan(world_size=ctx.world_size, global_batch=cfg.train.global_batch,
                           max_micro_batch=p.micro_batch)
    return check_plan(Plan(dp=p.dp, micro_batch=p.micro_batch, grad_accum=p.grad_accum),
                      world_size=ctx.world_size, global_batch=cfg.train.global_batch)


def make_recompute_plan(cfg: Config, model: nn.Module, micro_batch: int, precision,
                        device: torch.device | str | None = None) -> RecomputePlan | None:
    """With ``memory.recompute = "auto"``: the knapsack plan for the activation budget, else None.

    The budget is ``memory.budget_gib`` less 16 bytes per parameter (float32 weights and gradients, AdamW's
    two moments). The saved bytes follow the run's kernels (``plan_recompute(kernels=)``): ``"cuda"`` on a CUDA
    ``device`` (fused RMSNorm keeps its input and a float32 rstd; the norms read the float32 residual stream of
    autocast over the float32 weights DDP trains), else ``"cpu"`` (the CPU rules: what a CPU run keeps).
    ``device`` None: the model's parameters' device. Raises ConfigError when not even full recomputation fits.
    """
    m = cfg.memory
    if m.recompute != "auto":
        return None
    params = sum(p.numel() for p in model.parameters())
    budget = int(m.budget_gib * 2**30) - 16 * params
    dtype_bytes = precision.compute_dtype.itemsize
    if device is None:
        device = next(model.parameters()).device
    kernels = "cuda" if torch.device(device).type == "cuda" else "cpu"
    plan = plan_recompute(model.graph, max(budget, 0), micro_batch, None, dtype_bytes, key_padding={"backbone"},
                          kernels=kernels)
    if not plan.fits:
        raise ConfigError(f"memory.budget_gib: {m.budget_gib} GiB leaves {budget / 2**30:.3f} GiB for activations "
                          f"but even full recomputation keeps {plan.saved_bytes / 2**30:.3f} GiB "
                          f"(micro-batch {micro_batch})")
    return plan


def make_optimizer(model: nn.Module, cfg: Config):
    """AdamW (decay on matrices only) with linear warm-up and cosine decay (:func:`lf_orchestrator.fit.lr_schedule`)."""
    t = cfg.train
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t.lr, betas=(0.9, 0.95))
    return opt, lr_schedule(opt, t)


class TrainingLoss(nn.Module):
    """``forward(batch) = model.training_loss(batch)``, so data parallelism wraps the loss computation."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]):
        return self.model.training_loss(batch)


class Trainer:
    """One training run in ``run_dir`` (fresh, or resumed from its latest checkpoint)."""

    def __init__(self, cfg: Config, run_dir: Path, ctx: DistContext, *, resume: bool = False,
                 data_progress: Callable[[int, int], None] | None = None):
        self.cfg, self.run_dir, self.ctx = cfg, Path(run_dir), ctx
        torch.manual_seed(cfg.run.seed)
        self.plan = make_plan(cfg, ctx)  # before the data and the run folder's set-up files: fail fast
        self.dataset = prepare_dataset(cfg, ctx, data_progress)
        ckpt = latest_checkpoint(self.run_dir) if resume else None
        if resume and ckpt is None:
            raise FileNotFoundError(f"--resume {self.run_dir}: no complete checkpoint to resume from "
                                    f"under {self.run_dir / 'checkpoints'}")
        if resume:
            self.encoder = assembly.load_encoder(cfg, self.run_dir)
        else:
            self.encoder = assembly.build_encoder(cfg, self.dataset)
            if ctx.is_main:
                assembly.save_encoder(self.encoder, self.run_dir)
        vla_cfg = assembly.model_config(cfg, self.encoder)
        self.model = assembly.build_model(vla_cfg, ctx.device, cfg.run.seed, fused_ops=cfg.model.fused_ops)
        if ctx.is_main:
            assembly.save_model_spec(self.model, self.run_dir)
        self.precision = resolve_precision(cfg.memory.precision, ctx.device)
        self.recompute_plan = make_recompute_plan(cfg, self.model, self.plan.micro_batch, self.precision,
                                                  ctx.device)
        self.recomputed = apply_recompute(nn.ModuleList(self.model.blocks), cfg.memory.recompute,
                                          every=cfg.memory.recompute_every, plan=self.recompute_plan)
        self.scaler = DynamicLossScaler(ctx.device.type, enabled=self.precision.needs_loss_scaling)
        self.optimizer, self.scheduler = make_optimizer(self.model, cfg)
        self.dp_rank = ctx.rank  # data parallel only: every rank is a dp rank
        check_enough_samples(len(self.dataset), self.plan, cfg)
        self.sampler = ResumableSampler(len(self.dataset), batch_size=self.plan.micro_batch,
                                        seed=cfg.run.seed, rank=self.dp_rank, world_size=self.plan.dp)
        self.step = 0
        self.loss_module = TrainingLoss(self.model)
        self.checkpointer = FamilyCheckpointer(self.run_dir, distributed=ctx.distributed,
                                               keep=cfg.train.keep_checkpoints, async_save=cfg.train.async_checkpoint)
        self.resharded: str | None = None
        """Log line when the resumed checkpoint was written under another plan or world size."""
        if ckpt is not None:
            self._restore(ckpt)
        self.ddp_model = apply_data_parallel(self.loss_module, ctx)
        self._indices = iter(self.sampler)
        self.prefetcher = make_prefetcher(self, self._host_micro_batch)

    @property
    def state_module(self) -> nn.Module:
        """The module whose state is checkpointed (keys ``model.`` + the recipe model's names)."""
        return self.loss_module

    def _restore(self, path: Path) -> None:
        """Load checkpoint ``path`` (either layout) into the model, optimizer, schedule, scaler, sampler, RNG
        and step (call on every rank; also the rollback of ``train.on_nonfinite``)."""
        if is_legacy(path):
            self._restore_legacy(path)
        else:
            self.resharded = restore_training_state(self, path)

    def _restore_legacy(self, path: Path) -> None:
        """A full-state folder of lf-orchestrator 0.3 (``model.safetensors`` + ``state.pt``): same world size."""
        model_state, state = load_checkpoint(path, self.ctx.device)
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng_cpu"].cpu())
        self.step = int(state["step"])

    def save(self) -> Path:
        """Checkpoint the current step (call on every rank: each writes its shards, DCP de-duplicates the
        data-parallel replicas). With ``train.async_checkpoint`` the write goes on in the background (awaited by
        the next save and at the end of :meth:`fit`). Returns the checkpoint folder.

        Raises:
            NonFiniteError: a parameter holds NaN/inf (nothing is written)."""
        check_finite_weights(self.state_module, self.ctx, self.step, self.run_dir)
        return save_training_state(self)

    def _host_micro_batch(self, step: int) -> dict[str, torch.Tensor]:
        idx = [next(self._indices) for _ in range(self.plan.micro_batch)]
        batch = self.encoder.collate([self.dataset[i] for i in idx])
        batch["sample_seed"] = sample_seeds(self.cfg.run.seed, step, idx)
        return batch

    def step_batches(self) -> tuple[list[dict[str, torch.Tensor]], int]:
        """(this step's ``grad_accum`` micro-batches on the device, images at the model's size, collated ahead
        by :attr:`prefetcher`; their target tokens, counted on the host copies: no device sync)."""
        host = self.prefetcher.batches(self.step)
        tokens = sum(int(self.model.loss_normalizer(b)) for b in host)
        return [assembly.fit_images({k: v.to(self.ctx.device, non_blocking=True) for k, v in b.items()},
                                    self.model.cfg.image_size) for b in host], tokens

    def train_step(self) -> dict[str, float]:
        """One optimizer step over ``grad_accum`` micro-batches; returns its scalars."""
        batches, local_tokens = self.step_batches()
        tokens = global_sum(torch.tensor(float(local_tokens), device=self.ctx.device), self.ctx)
        # DDP averages gradients over ranks, so scale by world size to get sum / global tokens.
        denom = tokens.clamp(min=1.0) / self.ctx.world_size
        loss_sum = torch.zeros((), device=self.ctx.device)
        sums: dict[str, torch.Tensor] = {}  # the recipe's extra metrics (e.g. correct tokens), summed
        self.ddp_model.train()
        for b in batches:
            with self.precision.autocast(self.ctx.device.type), \
                    offload_activations(self.ctx.device, enabled=self.cfg.memory.offload):
                loss, metrics = self.ddp_model(b)
            self.scaler.scale(loss / denom).backward()
            loss_sum += loss.detach()
            for key, value in metrics.items():
                sums[key] = sums.get(key, torch.zeros((), device=self.ctx.device)) + value.detach()
        clip = self.cfg.train.grad_clip
        self.scaler.unscale_(self.optimizer)  # no-op unless fp16: clip the true gradients
        grad_norm = clip_grad_norm_(self.model.parameters(), clip)  # clip = 0: the norm only
        bad = nonfinite_reason(global_sum(loss_sum, self.ctx), grad_norm, check_grad=not self.scaler.enabled)
        if bad is not None:
            out = nonfinite_step(self, bad, float(grad_norm))
            out.pop("train/target_units", None)  # the recipe trainer's name; this one logs target tokens
            return out
        lr = apply_update(self)
        names = sorted(sums)
        stats = global_sum(torch.stack([loss_sum, *(sums[k].to(loss_sum.dtype) for k in names)]), self.ctx)
        return {"train/loss": float(stats[0] / tokens),
                **{f"train/{k}": float(stats[i + 1] / tokens) for i, k in enumerate(names)},
                "train/grad_norm": float(grad_norm), "train/lr": lr,
                "train/target_tokens": float(tokens),
                **({f"train/{k}": float(v) for k, v in self.scaler.log_fields().items()}
                   if self.scaler.enabled else {})}

    def fit(self, on_step: StepCallback | None = None) -> dict[str, Any]:
        """Train until ``train.steps``, logging and checkpointing; returns a summary
        (:func:`lf_orchestrator.fit.fit_loop`; throughput ``perf/tokens_per_s``: the global batch's sequence
        tokens per second).

        SIGTERM / SIGINT: the step is checkpointed and the summary says ``preempted`` (``signal``, ``exit_code``:
        143 / 130). The last checkpoint is committed when this returns (also after an asynchronous save).

        Raises:
            NonFiniteError: ``train.on_nonfinite = "stop"`` on a NaN/inf step (before its update), rollback gave
                up, or the weights to checkpoint hold NaN/inf.
        """
        tokens = self.cfg.train.global_batch * self.model.cfg.seq_len
        label = "action-token cross-entropy" if self.cfg.model.recipe == "vla" else \
            "flow-matching loss (normalized actions)"
        return fit_loop(self, on_step, step_units=lambda _: tokens, rate_key="perf/tokens_per_s", loss_label=label)
