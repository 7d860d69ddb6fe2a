"""Pipeline parallel (``plan.pp > 1``) in the trainer: the stages of this rank and one optimizer step.

The model is never built whole: this pipeline rank's stage modules are built with the FLOP-balanced split of the
IR, full-model parameter names and the single-process model's weights, by
:func:`lf_parallel._pipeline.build_pipeline` for a family whose model is one trunk (the llm family: token ids in,
logits out) or by :func:`lf_parallel._pipeline_mm.build_multimodal_pipeline` for a family that gives
:attr:`~lf_orchestrator.families.base.Family.pipeline_model` (the VLA: stage 0 runs the encoders and the recipe's
``embed_inputs`` glue; its key-padding mask travels with the hidden states). The family says what the first
stage takes and what the loss compares (:meth:`~lf_orchestrator.families.base.Family.pipeline_inputs`,
:meth:`~lf_orchestrator.families.base.Family.pipeline_loss_sum`).

Each stage gets, in this order, tensor (+ sequence) parallel on the ``tp`` sub-mesh, activation recomputation,
then FSDP2 (ZeRO-2/3) over the data-parallel sub-mesh of its pipeline rank, or (ZeRO-0/1)
one flat gradient all-reduce over it after the schedule (see :func:`_average_grads`);
the ``torch.distributed.pipelining`` schedule (``plan.pp_schedule``) runs ``plan.grad_accum`` micro-batches of
``plan.micro_batch`` samples per step over the ``pp`` sub-mesh.

Between the llm family's stages flows ``(hidden_bsd, positions_bs, document_ids_bs)``: the packed-document rotary
positions and document ids reach every block (lf-parallel's side-tensor protocol). Under sequence
parallel each tp rank sends its local sequence shard of the hidden states.

Losses stay exact: the schedule runs with ``scale_grads=False`` and each micro-batch's loss is
``loss_sum * dp / global_units`` (DDP / FSDP average over dp), so a pipeline run takes the single-process
run's steps. The last pipeline stage has the loss; one all-reduce over the world gives it to every rank for
logging. The gradient norm for clipping is global over pp, tp and dp ranks (``lf_parallel.clip_grad_norm_`` with
the pp group).

State: :class:`StageView` holds this rank's stage modules (one, or several under the interleaved schedules)
as one module whose names are the full model's under the trainer's ``model.`` prefix (the layers of other
stages are absent), so a checkpoint written under pp loads under any plan and back (DCP reshards), and
``lf eval`` / ``load_model_weights`` / ``lf convert export-hf`` read it like any other.
"""

from __future__ import annotations

import torch
from torch import nn

from lf_parallel import clip_grad_norm_, global_sum

SIDE = ("positions", "document_ids")
"""Side tensors of the one-trunk build (the llm family) sent with the hidden states (lf-parallel names), in
order: the first stage takes ``(input_ids, positions, document_ids)``."""


def _merge(dst: nn.Module, src: nn.Module) -> None:
    """Attach ``src``'s children to ``dst`` by name, recursing where both hold a container; ``nn.Identity``
    placeholders (layers of another stage) are left out."""
    for name, child in src.named_children():
        if isinstance(child, nn.Identity):
            continue
        mine = dst._modules.get(name)
        if mine is None:
            # a lowered layer (it has its IR node), or a module with parameters of its own: attached whole
            if getattr(child, "lf_node", None) is not None or child._parameters or not list(child.children()):
                dst._modules[name] = child
                continue
            mine = dst._modules[name] = nn.Module()
        _merge(mine, child)


class StageView(nn.Module):
    """This rank's pipeline stage modules as one module named like the trainer's ``LossModule``.

    ``state_dict`` / ``named_parameters`` keys are ``model.`` + the full model's names (e.g.
    ``model.components.text.layers.3.attention.q.weight``) for the layers this rank holds, with no
    per-stage container prefix; the modules are shared, so loading into the view loads the stages.
    """

    def __init__(self, stages: list[nn.Module]):
        super().__init__()
        self.model = nn.Module()
        for stage in stages:
            _merge(self.model, stage)


class StageLoss:
    """The schedule's ``loss_fn``: the family's loss sum of a micro-batch (``pipeline_loss_sum``) over ``denom``.

    ``denom`` (global target units / dp) and ``scale`` (the loss scaler's multiply) are set before each step;
    ``sums`` collects the float32 loss sums of the step's micro-batches (last stage only; the schedule's first
    step also calls it during its shape inference, so the last ``n_microbatches`` entries are the real ones).
    """

    def __init__(self, loss_sum):
        self.loss_sum = loss_sum
        self.denom, self.scale, self.sums = torch.tensor(1.0), (lambda x: x), []

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss_sum = self.loss_sum(output, target)
        self.sums.append(loss_sum.detach())
        return self.scale(loss_sum / self.denom)


class PipelineModel:
    """This rank's part of a pipeline-parallel model: schedule, stage modules, their :class:`StageView`.

    Args:
        family: the run's family: its ``graph``, ``pipeline_model`` (None: the one-trunk build, causal mask and
            the llm's side tensors), ``pipeline_inputs`` and ``pipeline_loss_sum``.
        cfg: the run config (``run.seed`` initializes the stages like the single-process model).
        plan: a checked plan with ``pp > 1``.
        mesh: the plan's 5-D mesh.
        device: this rank's device.
        recompute: ``(blocks) -> recomputed block indices`` (activation recomputation of a stage's blocks).
    """

    def __init__(self, family, cfg, plan, mesh, device: torch.device, recompute):
        from lf_kernels import MaskSpec
        from lf_parallel import apply_tensor_parallel, apply_zero, build_multimodal_pipeline, build_pipeline

        self.plan, self.mesh = plan, mesh
        self.pp_rank = mesh.get_local_rank("pp")
        self.pp_group = mesh["pp"].get_group()
        self.family = family
        self.loss = StageLoss(family.pipeline_loss_sum)
        self.recomputed: list[int] = []
        self.dp_group = None
        """ZeRO-0/1 with dp > 1: the group whose gradients :meth:`step` averages (DDP's job without pp)."""

        def parallelize(stage: nn.Module) -> nn.Module:
            if plan.tp > 1:
                apply_tensor_parallel(stage, mesh["tp"], plan, loss_parallel=False)
            self.recomputed += recompute([b for c in stage.components.values() for b in c.blocks])
            if plan.zero_stage >= 2:
                return apply_zero(stage, mesh, plan)
            if plan.dp > 1 and self.dp_group is None:
                from lf_parallel import flat_dp_group

                self.dp_group = flat_dp_group(mesh, plan)
            return stage

        common = dict(pp_rank=self.pp_rank, pp=plan.pp, schedule=plan.pp_schedule, n_microbatches=plan.grad_accum,
                      loss_fn=self.loss, device=device, seed=cfg.run.seed, group=self.pp_group,
                      virtual_stages=plan.pp_virtual_stages, scale_grads=False, parallelize=parallelize)
        if family.pipeline_model is None:
            self.schedule, self.stages = build_pipeline(family.graph, mask=MaskSpec(kind="causal"), side=SIDE,
                                                        **common)
        else:
            self.schedule, self.stages = build_multimodal_pipeline(family.pipeline_model, **common)
        self.view = StageView(self.stages)

    @property
    def is_last(self) -> bool:
        return self.pp_rank == self.plan.pp - 1

    def step(self, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """Forward + backward of the step's micro-batches; returns the sum of their loss sums (0 off the last
        stage). Set ``self.loss.denom`` / ``.scale`` first."""
        full = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
        self.loss.sums = []
        inputs, target = self.family.pipeline_inputs(full)
        if self.is_last:
            self.schedule.step(*(inputs if self.pp_rank == 0 else ()), target=target, losses=[])
        else:
            self.schedule.step(*(inputs if self.pp_rank == 0 else ()))
        device = target.device
        if self.dp_group is not None:
            _average_grads(self.view.parameters(), self.dp_group, self.plan.dp)
        # the first step's metadata inference calls loss_fn once more, on placeholder outputs, before the real ones
        sums = self.loss.sums[-len(batches):]
        return torch.stack(sums).sum() if sums else torch.zeros((), device=device)


def _average_grads(params, group, dp: int) -> None:
    """Average the gradients over ``group`` in one flat all-reduce per dtype (the local shards of DTensors).

    DDP cannot wrap a pipeline stage here: the schedule's shape inference runs a backward on the first step,
    and DDP's reducer then sees every parameter ready twice (an internal assert when it rebuilds its buckets).
    """
    from torch.distributed.tensor import DTensor

    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            g = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
            by_dtype.setdefault(g.dtype, []).append(g)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat, group=group)
        flat /= dp
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def pipeline_train_step(trainer) -> dict[str, float]:
    """:meth:`Trainer.train_step` of a pipeline-parallel plan: one optimizer step over ``grad_accum``
    micro-batches run by the pipeline schedule; returns the same scalars."""
    from lf_orchestrator.families._faults import nonfinite_step
    from lf_orchestrator.faults import nonfinite_reason
    from lf_orchestrator.train.fit import apply_update, scaler_fields

    plan, ctx, pipe = trainer.plan, trainer.ctx, trainer.pipe
    batches, local = trainer.step_batches()
    replicas = ctx.world_size // plan.dp  # tp x pp ranks holding the same batch
    units = global_sum(torch.tensor(float(local), device=ctx.device), ctx) / replicas
    pipe.loss.denom = units.clamp(min=1.0) / plan.dp
    pipe.loss.scale = trainer.scaler.scale
    trainer.wrapped.train()
    with trainer.precision.autocast(ctx.device.type):
        loss_sum = pipe.step(batches)
    trainer.scaler.unscale_(trainer.optimizer)
    grad_norm = clip_grad_norm_(trainer.wrapped.parameters(), trainer.cfg.train.grad_clip, pp_group=pipe.pp_group)
    # the last stage's tp ranks each hold their dp rank's loss sum; every rank holds the global norm
    stats = global_sum(torch.stack([loss_sum.float(), grad_norm.to(loss_sum)]), ctx)
    loss_total = stats[0] / plan.tp
    bad = nonfinite_reason(loss_total, stats[1], check_grad=not trainer.scaler.enabled)
    if bad is not None:
        return nonfinite_step(trainer, bad, float(grad_norm))
    lr = apply_update(trainer)
    return {"train/loss": float(loss_total / units), "train/grad_norm": float(grad_norm), "train/lr": lr,
            "train/target_units": float(units), **scaler_fields(trainer.scaler)}
