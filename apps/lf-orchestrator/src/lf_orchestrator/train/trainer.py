"""The one trainer of `lf run`, for every family (llm, vlm, video, video_vae, vla): family -> model -> plan -> steps.

The order in which techniques are applied is written here once: build on meta ->
materialize -> LoRA / freezing -> tensor (+ sequence) parallel -> activation
recomputation (a mode for every block, or ``memory.recompute = "auto"``: lf-memory's planner per block,
:mod:`lf_orchestrator.families._recompute`) -> data parallel / ZeRO (``lf_parallel.parallelize``) -> optimizer.
The plan is searched or parsed and checked before any of it
(:mod:`lf_orchestrator.families._plan`).

Losses are normalized by the target units (tokens with a label, or samples) of the
whole global batch, over micro-batches and data-parallel ranks: each micro-batch
contributes ``loss_sum * dp / global_units`` and DDP / FSDP average gradients over
the dp ranks, so any split gives the gradient of one large batch. Tensor-, context- and
pipeline-parallel ranks of one dp rank see the same batch; under context parallelism each cp rank
computes its share of the loss on its token shard and contributes ``share * dp * cp / global_units``
(gradients are averaged over dp x cp; :mod:`lf_orchestrator.families._context`). Pipeline-parallel plans
(``pp > 1``, recipes whose spec declares it) build only this rank's stages and run the step through the
plan's schedule (:mod:`lf_orchestrator.train._pipeline_step`).

Checkpoints are sharded DCP folders (:mod:`lf_orchestrator.families._state`): every
rank writes its own shards of the model and optimizer; the scheduler, loss scaler,
each dp rank's sampler position, each rank's RNG state, the step and the plan go
with them. Written atomically (``latest`` only ever names a complete folder), the
newest ``train.keep_checkpoints`` kept, in the background with
``train.async_checkpoint``. A run resumes bit for bit under its own plan, and under
another plan or world size DCP reshards the state (logged).

Faults (:mod:`lf_orchestrator.families._faults`): a NaN/inf loss or gradient norm is handled by
``train.on_nonfinite`` before the update; weights holding NaN/inf are never checkpointed; SIGTERM / SIGINT
save the step and stop (exit 143 / 130); ``train.hang_timeout_s`` arms the hang watchdog. The fit loop is
:func:`lf_orchestrator.train.fit.fit_loop`. ``memory.offload`` keeps the activations saved for backward in host
memory (``lf_memory.offload_activations``) on every plan without pipeline stages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from lf_data import ResumableSampler
from lf_ir import param_count
from lf_memory import DynamicLossScaler, apply_recompute, offload_activations, resolve_precision
from lf_orchestrator.checkpoint import latest_checkpoint
from lf_orchestrator.families import family_module
from lf_orchestrator.families._faults import check_finite_weights, nonfinite_step
from lf_orchestrator.families._plan import capability_refusal, manual_plan, resolve_plan, with_fsdp_compute
from lf_orchestrator.families._recompute import describe_plan, plan_family_recompute, stage_plan
from lf_orchestrator.families._state import FamilyCheckpointer
from lf_orchestrator.families.base import LossModule
from lf_orchestrator.families.lora import apply_lora, freeze
from lf_orchestrator.faults import nonfinite_reason
from lf_orchestrator.prefetch import make_prefetcher
from lf_orchestrator.train.fit import (
    StepCallback,
    apply_update,
    check_enough_samples,
    fit_loop,
    lr_schedule,
    scaler_fields,
)
from lf_orchestrator.train.state import restore_training_state, save_training_state
from lf_parallel import DistContext, PlanError, build_mesh, check_plan, clip_grad_norm_, global_sum, parallelize


def precision_name(dtype: torch.dtype) -> str:
    """The plan search's name of a compute dtype: ``"bf16"``, ``"fp16"`` or ``"fp32"``."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def prepare_family(cfg, run_dir: Path, ctx: DistContext, data_progress=None):
    """The run's family with its data prepared: rank 0 builds the caches (into ``run_dir`` and the cache folders),
    then the other ranks load them. ``data_progress(done, total)``: progress of a data generation (rank 0)."""
    family = family_module(cfg.model.recipe).make_family(cfg, Path(run_dir), ctx)
    family.data_progress = data_progress
    if ctx.is_main:
        family.prepare()
    if ctx.distributed:
        torch.distributed.barrier()
    if not ctx.is_main:
        family.prepare()
    return family


def prepare_model(family, cfg, device: torch.device) -> tuple[nn.Module, dict]:
    """The family's model with LoRA and freezing applied (before any parallelism); info for plan.json."""
    model = family.build_model(device)
    t, info = cfg.train, {}
    if t.lora_rank > 0:
        info["lora_modules"] = apply_lora(model, t.lora_targets, t.lora_rank, t.lora_alpha, seed=cfg.run.seed)
    if t.freeze:
        info["frozen_params"] = len(freeze(model, t.freeze))
    info["params"] = sum(p.numel() for p in model.parameters())
    info["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if cfg.model.fused_ops:  # modules switched to lf-kernels' fused ops (lf_ir.use_fused_ops)
        from lf_ir import fused_modules

        info["fused_ops"] = sum(m.fused for m in fused_modules(model))
    return model, info


class Trainer:
    """One run of any family in ``run_dir`` (fresh, or resumed from its latest checkpoint).

    Args:
        cfg: the run config.
        run_dir: the run folder (created by rank 0 when missing).
        ctx: this process's ``lf_parallel.DistContext``.
        resume: load the latest checkpoint of ``run_dir`` (FileNotFoundError when there is none).
        family: the prepared family (:func:`prepare_family`); None prepares it here.
        plan: ``(plan, info)`` chosen by the caller (``parallel.tune = "measure"``); None resolves the config's.
        data_progress: ``progress(done, total)`` of a data generation while the family prepares (rank 0).
    """

    def __init__(self, cfg, run_dir: Path, ctx: DistContext, *, resume: bool = False, family=None,
                 plan: tuple[Any, dict] | None = None, data_progress=None):
        self.cfg, self.run_dir, self.ctx = cfg, Path(run_dir), ctx
        torch.manual_seed(cfg.run.seed)
        if ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if plan is None and cfg.parallel.plan == "manual":  # degrees, world size, batch split: before any data
            early = check_plan(manual_plan(cfg), world_size=ctx.world_size, global_batch=cfg.train.global_batch)
            why = capability_refusal(early, cfg)  # what the recipe declares it supports
            if why:
                raise PlanError(f"parallel.spec {cfg.parallel.spec!r}: {why}")
        self.family = family if family is not None else prepare_family(cfg, self.run_dir, ctx, data_progress)
        self.precision = resolve_precision(cfg.memory.precision, ctx.device)
        prec = precision_name(self.precision.compute_dtype)
        if plan is not None:  # chosen by the caller (parallel.tune = "measure": families._tune)
            self.plan, self.plan_info = with_fsdp_compute(plan[0], prec, ctx.device.type), dict(plan[1])
        else:
            self.plan, self.plan_info = resolve_plan(cfg, self.family.graph, world_size=ctx.world_size,
                                                     device_type=ctx.device.type, seq=self.family.seq_len,
                                                     precision=prec)
        if getattr(self.family, "data_note", ""):  # e.g. synthetic latents: the log and plan.json say so
            self.plan_info["data"] = self.family.data_note
        self.pipe = None
        """The pipeline stages of this rank (``plan.pp > 1``), else None."""
        if self.plan.pp == 1:
            self.model, model_info = prepare_model(self.family, cfg, ctx.device)
            self.plan_info.update(model_info)
        mode = cfg.memory.recompute if cfg.memory.recompute != "none" else self.plan_info.get("recompute", "none")
        self.plan_info["recompute"] = mode
        self.mesh = build_mesh(self.plan, ctx.device.type) if ctx.distributed else None
        self.recompute_plan = None
        """With ``memory.recompute = "auto"``: this rank's :class:`lf_memory.RecomputePlan`, else None."""
        if mode == "auto":
            self.recompute_plan = plan_family_recompute(
                cfg, self.family, self.plan, self.precision.compute_dtype.itemsize,
                pp_rank=self.mesh.get_local_rank("pp") if self.plan.pp > 1 else 0,
                kernels="cuda" if ctx.device.type == "cuda" else "cpu")  # the bytes this device's kernels save
            self.plan_info["recompute_plan"] = describe_plan(self.recompute_plan)

        def recompute(_module: nn.Module) -> None:
            self.plan_info["recomputed_blocks"] = apply_recompute(
                nn.ModuleList(self.model.blocks), mode, every=cfg.memory.recompute_every, plan=self.recompute_plan)

        if self.plan.pp > 1:
            from lf_orchestrator.train._pipeline_step import PipelineModel

            self.pipe = PipelineModel(self.family, cfg, self.plan, self.mesh, ctx.device, lambda blocks: (
                apply_recompute(nn.ModuleList(blocks), mode, every=cfg.memory.recompute_every,
                                plan=stage_plan(self.recompute_plan, blocks) if self.recompute_plan else None)))
            self.plan_info["recomputed_blocks"] = self.pipe.recomputed
            self.wrapped = self.loss_module = self.pipe.view
            self.model = self.pipe.view.model
            self.plan_info["stage_params"] = sum(p.numel() for p in self.model.parameters())  # this rank's stages
            self.plan_info["params"] = self.plan_info["trainable_params"] = param_count(self.family.graph)
            coord = self.mesh.get_coordinate()
            self.dp_rank = coord[1] * self.mesh["dp_shard"].size() + coord[2]
        elif self.mesh is not None:
            self.loss_module = LossModule(self.model, self.family)
            self.wrapped = parallelize(self.loss_module, self.mesh, self.plan, loss_parallel=False,
                                       recompute=recompute)
            if self.plan.cp > 1:  # this rank's place in the cp group: the family feeds it its token shard
                from lf_parallel import context_parallel_of

                self.loss_module.cp = context_parallel_of(self.mesh, self.plan)
            coord = self.mesh.get_coordinate()
            self.dp_rank = coord[1] * self.mesh["dp_shard"].size() + coord[2]
        else:
            self.loss_module = LossModule(self.model, self.family)
            recompute(self.loss_module)
            self.wrapped, self.dp_rank = self.loss_module, 0
        self.optimizer = self._optimizer()
        t = cfg.train
        self.scheduler = lr_schedule(self.optimizer, t)
        # ranks hold different gradient shards / stages: an inf in one must skip the step on all
        self.scaler = DynamicLossScaler(ctx.device.type, enabled=self.precision.needs_loss_scaling,
                                        process_group=torch.distributed.group.WORLD if ctx.distributed else None)
        check_enough_samples(self.family.num_samples, self.plan, cfg)
        self.sampler = ResumableSampler(self.family.num_samples, batch_size=self.plan.micro_batch, seed=cfg.run.seed,
                                        rank=self.dp_rank, world_size=self.plan.dp)
        self.step = 0
        self.checkpointer = FamilyCheckpointer(self.run_dir, distributed=ctx.distributed, keep=t.keep_checkpoints,
                                               async_save=t.async_checkpoint)
        self.resharded: str | None = None
        """Log line when the resumed checkpoint was written under another plan or world size."""
        ckpt = latest_checkpoint(self.run_dir) if resume else None
        if resume and ckpt is None:
            raise FileNotFoundError(f"--resume {self.run_dir}: no complete checkpoint under "
                                    f"{self.run_dir / 'checkpoints'}")
        if ckpt is not None:
            self._restore(ckpt)
        self._indices = iter(self.sampler)
        self.prefetcher = make_prefetcher(self, self._host_micro_batch)

    @property
    def state_module(self) -> nn.Module:
        """The module whose state is saved (the DDP wrapper's inside, else the parallelized module)."""
        return getattr(self.wrapped, "module", self.wrapped)

    def _optimizer(self) -> torch.optim.Optimizer:
        t = self.cfg.train
        params = [p for p in self.wrapped.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": t.weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        if self.plan.zero_stage == 1 and self.plan.dp > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            from lf_parallel import flat_dp_group

            opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW,
                                          process_group=flat_dp_group(self.mesh, self.plan), lr=t.lr,
                                          betas=(0.9, 0.95), weight_decay=groups[0]["weight_decay"])
            for g in groups[1:]:
                opt.add_param_group(g)
            return opt
        from lf_parallel import tensor_kind_groups

        # AdamW's foreach / fused kernels cannot mix plain tensors and DTensors in one group. On CUDA the fused
        # kernel (one launch per group, as bench/llama3_parallel.py measures); elsewhere PyTorch's default.
        fused = True if self.ctx.device.type == "cuda" else None
        return torch.optim.AdamW(tensor_kind_groups(groups), lr=t.lr, betas=(0.9, 0.95), fused=fused)

    def _restore(self, path: Path) -> None:
        """Load checkpoint ``path`` (written under any plan) into this run's sharded model and optimizer,
        and its scheduler, loss scaler, sampler position, RNG states and step (:mod:`lf_orchestrator.train.state`;
        also the rollback of ``train.on_nonfinite``)."""
        self.resharded = restore_training_state(self, path)

    def save(self) -> Path:
        """Checkpoint the current step (call on every rank): each rank writes its shards, rank 0 the rest
        (:func:`lf_orchestrator.train.state.save_training_state`; a step-0 save leaves the optimizer empty).

        With ``train.async_checkpoint`` the write continues in the background (awaited by the next save and
        at the end of :meth:`fit`); returns the checkpoint folder.

        Raises:
            NonFiniteError: a parameter holds NaN/inf (nothing is written)."""
        check_finite_weights(self.state_module, self.ctx, self.step, self.run_dir)
        return save_training_state(self)

    def _host_micro_batch(self, step: int) -> dict[str, torch.Tensor]:
        idx = [next(self._indices) for _ in range(self.plan.micro_batch)]
        return self.family.collate(idx, step)

    def step_batches(self) -> tuple[list[dict[str, torch.Tensor]], int]:
        """(this step's ``grad_accum`` micro-batches on the device, drawn ahead by :attr:`prefetcher`; their
        target units, counted on the host copies: no device sync)."""
        host = self.prefetcher.batches(self.step)
        units = sum(int(self.family.normalizer(b)) for b in host)
        return [self.family.to_device(b, self.ctx.device, non_blocking=True) for b in host], units

    def train_step(self) -> dict[str, float]:
        """One optimizer step over ``grad_accum`` micro-batches; returns its scalars."""
        if self.pipe is not None:
            from lf_orchestrator.train._pipeline_step import pipeline_train_step

            return pipeline_train_step(self)
        batches, local = self.step_batches()
        replicas = self.ctx.world_size // self.plan.dp  # tp and cp ranks holding the same samples
        units = global_sum(torch.tensor(float(local), device=self.ctx.device), self.ctx) / replicas
        # cp ranks compute shares of the loss and DDP / FSDP average over dp x cp (families/_context.py)
        denom = units.clamp(min=1.0) / (self.plan.dp * self.plan.cp)
        loss_sum = torch.zeros((), device=self.ctx.device)
        sums: dict[str, torch.Tensor] = {}
        self.wrapped.train()
        for b in batches:
            with self.precision.autocast(self.ctx.device.type), \
                    offload_activations(self.ctx.device, enabled=self.cfg.memory.offload):
                loss, metrics = self.wrapped(b)
            self.scaler.scale(loss / denom).backward()
            loss_sum += loss.detach()
            for key, value in metrics.items():
                sums[key] = sums.get(key, torch.zeros((), device=self.ctx.device)) + value.detach().float()
        self.scaler.unscale_(self.optimizer)
        grad_norm = clip_grad_norm_(self.wrapped.parameters(), self.cfg.train.grad_clip)
        names = sorted(sums)  # one all-reduce: the scalars, and the gradient norm for the non-finite check
        stats = global_sum(torch.stack([loss_sum, *(sums[k] for k in names), grad_norm.to(loss_sum)]),
                           self.ctx) / (replicas // self.plan.cp)  # cp shares sum to the loss: count them once
        bad = nonfinite_reason(stats[0], stats[-1], check_grad=not self.scaler.enabled)
        if bad is not None:
            return nonfinite_step(self, bad, float(grad_norm))
        lr = apply_update(self)
        return {"train/loss": float(stats[0] / units), **{f"train/{k}": float(stats[i + 1] / units)
                                                           for i, k in enumerate(names)},
                "train/grad_norm": float(grad_norm), "train/lr": lr, "train/target_units": float(units),
                **scaler_fields(self.scaler)}

    def evaluate(self) -> dict[str, float]:
        """The family's held-out metrics (every rank computes them on the unwrapped model); none under pipeline
        parallel (no rank holds the whole model; the run's last line says that the eval was skipped)."""
        if self.pipe is not None:
            return {}
        self.wrapped.eval()
        with torch.no_grad(), self.precision.autocast(self.ctx.device.type):
            out = self.wrapped({}, evaluate=True)
        self.wrapped.train()
        return out

    def fit(self, on_step: StepCallback | None = None) -> dict[str, Any]:
        """Train until ``train.steps``, logging, checkpointing and evaluating at the end (``eval.at_end``);
        returns a summary with ``eval`` and ``plan`` (:func:`lf_orchestrator.train.fit.fit_loop`; throughput
        ``perf/units_per_s``: target units per second, ``perf/tokens_per_s``: the global batch's ``seq_len``
        tokens per second, ``perf/samples_per_s``).

        SIGTERM / SIGINT: the step is checkpointed and the summary says ``preempted`` (``signal``: the name,
        ``exit_code``: 143 / 130); no evaluation then.

        Raises:
            NonFiniteError: ``train.on_nonfinite = "stop"`` on a NaN/inf step (before its update), rollback gave
                up, or the weights to checkpoint hold NaN/inf.
        """
        evaluate = self.evaluate if self.cfg.eval.at_end else (lambda: {})  # the summary always has "eval"
        return fit_loop(self, on_step, step_units=lambda s: s["train/target_units"], rate_key="perf/units_per_s",
                        loss_label=self.family.loss_label, evaluate=evaluate, summary={"plan": self.plan.describe()},
                        tokens_per_step=self.cfg.train.global_batch * self.family.seq_len)
