"""Pipeline parallelism: IR-driven stage modules run by ``torch.distributed.pipelining`` schedules.

Built on PyTorch's pipelining package (``PipelineStage`` and its schedules); what
lf adds is the split (:mod:`lf_parallel._stages`: FLOP-balanced from the IR, no
model-specific code) and stage modules that keep the full model's parameter
names, so ``lf_ir.materialize(stage, device, seed)`` gives every stage exactly
the weights the single-process model gets and state dicts line up with it.

Schedules (``Plan.pp_schedule``) and where they run (checked with torch 2.13):

- ``"gpipe"`` -> ``ScheduleGPipe``; ``"1f1b"`` -> ``Schedule1F1B``: one stage per
  rank; CPU (gloo) and GPU (NCCL).
- ``"interleaved_1f1b"`` -> ``ScheduleInterleaved1F1B``; ``"zero_bubble"`` ->
  ``ScheduleInterleavedZeroBubble`` (Qi et al., "Zero Bubble Pipeline
  Parallelism", ICLR 2024; splits backward into input- and weight-gradient
  passes): ``virtual_stages`` per rank, looped placement; CPU (gloo) and GPU.
  The V-shaped ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` fail on gloo
  (DESIGN.md, "Known CPU gaps") and are not offered.

Stages are :class:`lf_parallel._pipeline_stage.LfPipelineStage`: torch's ``PipelineStage`` whose split
(input / weight) backward differentiates the parameters the forward used, so ``zero_bubble`` is exact under
FSDP2 ZeRO-3 too (torch's takes ``submod.parameters()``, the resharded blocks' sharded parameters, and drops
their weight gradients).

The loss goes through the schedule's ``loss_fn(output, target)`` on the last
stage; the schedule splits the batch into ``n_microbatches`` along dim 0 and
averages gradients over them (``scale_grads=True``), so with a mean loss per
micro-batch the gradients equal the single-process gradient of the whole batch.

Side tensors: between stages flows ``(hidden_bsd, *side)``: per-micro-batch tensors the
trunk needs at every block (``positions`` and ``document_ids``, (batch, seq) int64, batch
as dim 0), named once by ``side`` (:data:`SIDE_KWARGS` keys) when the stages are built.
The first stage takes ``(ids_bs, *side)``, a middle stage's ``forward(hidden, *side)``
returns ``(hidden, *side)``, the last returns the head's output. Integer side tensors
need no gradient; the schedule sends them on with the activations. With ``side = ()``
one tensor flows, as before. Under sequence parallel the hidden states sent between
stages are each tp rank's local sequence shard (batch, seq / tp, dim); side tensors
stay whole (attention sees the gathered sequence).

``scale_grads=False`` leaves the gradient sum over micro-batches as is (a ``loss_fn``
that already divides by the global count of target units, as the trainer's).

Legend: ``ids_bs`` (batch, seq) int64; ``x_bsd`` (batch, seq, dim).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from lf_ir import ComponentModule, Graph, LMHead
from lf_kernels import MaskSpec
from lf_parallel._pipeline_stage import LfPipelineStage
from lf_parallel._stages import StageSpec, split_stages

__all__ = ["SCHEDULES", "SIDE_KWARGS", "PipelineStageModule", "build_pipeline", "build_stage_module", "pipeline_step"]

SCHEDULES: dict[str, type] = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zero_bubble": ScheduleInterleavedZeroBubble,
}
"""``Plan.pp_schedule`` name -> torch schedule class."""

_SINGLE_STAGE = ("gpipe", "1f1b")

SIDE_KWARGS: dict[str, str] = {"positions": "positions", "document_ids": "document_ids"}
"""Side tensor name -> keyword of ``ComponentModule.forward`` it is passed as."""


class PipelineStageModule(nn.Module):
    """The trunk layers ``[spec.start, spec.stop)`` of a lowered model; other layers are ``nn.Identity``.

    Parameters keep the full model's qualified names (``components.<trunk>.layers.<i>.*``).
    The first stage takes what the trunk's first node takes (token ids
    ``(batch, seq)`` int64 for an LLM); later stages take and return hidden
    states ``(batch, seq, dim)``; the last stage returns the head's output
    (logits ``(batch, seq, vocab)``). With ``side`` names (keys of :data:`SIDE_KWARGS`) every
    stage also takes those per-micro-batch tensors after its first input, and every stage but
    the last returns them after its hidden states: ``(hidden_bsd, *side)``.
    """

    def __init__(self, graph: Graph, spec: StageSpec, mask: MaskSpec, side: tuple[str, ...] = ()):
        super().__init__()
        bad = [n for n in side if n not in SIDE_KWARGS]
        if bad:
            raise ValueError(f"pipeline side tensors must be among {sorted(SIDE_KWARGS)}, got {bad[0]!r}")
        if spec.encoders:
            raise ValueError(
                f"graph {graph.name!r}: stage 0 runs encoder components {list(spec.encoders)}, which need "
                "the recipe model's glue code: build the stage with build_stage_module(..., model=recipe_model) "
                "(or build_multimodal_pipeline), not PipelineStageModule directly")
        component = graph.component(spec.trunk)
        for i, node in enumerate(component.nodes[spec.start:spec.stop], start=spec.start):
            if isinstance(node, LMHead) and node.tied_to is not None:
                tied = next(j for j, n in enumerate(component.nodes) if n.name == node.tied_to)
                if not spec.start <= tied < spec.stop:
                    raise ValueError(f"stage {spec.index}: head {node.name!r} (node {i}) is tied to "
                                     f"{node.tied_to!r} (node {tied}) on another pipeline stage; untie the "
                                     "embeddings (model.tie_embeddings=false) to pipeline this model")
        self.spec = spec
        self.mask = mask
        self.side = tuple(side)
        self.is_last = spec.stop == len(component.nodes)
        trunk = ComponentModule(component)
        for i in range(len(trunk.layers)):
            if not spec.start <= i < spec.stop:
                trunk.layers[i] = nn.Identity()
        self.components = nn.ModuleDict({spec.trunk: trunk})

    def forward(self, x: torch.Tensor, *side: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """``x``: ids ``(batch, seq)`` (first stage) or hidden ``(batch, seq, dim)``; ``side``: the tensors
        named by ``self.side``, in that order. Returns hidden (plus ``side`` when there are side tensors)
        or, on the last stage, the head's output.

        Raises:
            ValueError: the number of side tensors is not ``len(self.side)``.
        """
        if len(side) != len(self.side):
            raise ValueError(f"stage {self.spec.index}: expected side tensors {list(self.side)}, got {len(side)}")
        kwargs = {SIDE_KWARGS[n]: t for n, t in zip(self.side, side, strict=True)}
        out = self.components[self.spec.trunk](x, mask=self.mask, start=self.spec.start, stop=self.spec.stop,
                                               **kwargs)
        return out if self.is_last or not side else (out, *side)


def build_stage_module(graph: Graph, spec: StageSpec, mask: MaskSpec, side: tuple[str, ...] = (), *,
                       model: nn.Module | None = None) -> nn.Module:
    """Build one stage on the current default device (use ``torch.device("meta")``, then ``materialize``).

    ``model``: the whole recipe model of a multi-component graph (built on the same device); the stage is
    then a :class:`lf_parallel._pipeline_mm.MultimodalStageModule` running the recipe's pipeline glue.

    Raises:
        ValueError: the stage holds a head tied to an embedding on another stage, or the stage
            would run encoder components and no ``model`` is given.
    """
    if model is not None:
        from lf_parallel._pipeline_mm import MultimodalStageModule

        return MultimodalStageModule(model, spec)
    return PipelineStageModule(graph, spec, mask, side)


def check_schedule_args(schedule: str, *, pp_rank: int, pp: int, virtual_stages: int) -> None:
    """Raise ``ValueError`` for an unknown schedule, ``virtual_stages > 1`` under a one-stage-per-rank
    schedule (``gpipe`` / ``1f1b``), or ``pp_rank`` outside ``[0, pp)``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"parallel.pp_schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
    if schedule in _SINGLE_STAGE and virtual_stages != 1:
        raise ValueError(f"parallel.pp_schedule={schedule!r} runs one stage per rank; "
                         f"got pp_virtual_stages={virtual_stages} (use 'interleaved_1f1b' or 'zero_bubble')")
    if not 0 <= pp_rank < pp:
        raise ValueError(f"pp_rank must be in [0, {pp}), got {pp_rank}")


def build_pipeline(graph: Graph, *, pp_rank: int, pp: int, schedule: str, n_microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], mask: MaskSpec,
                   device: torch.device, seed: int, group=None, virtual_stages: int = 1,
                   materialize: Callable[[nn.Module, torch.device, int], nn.Module] | None = None,
                   side: tuple[str, ...] = (), scale_grads: bool = True,
                   parallelize: Callable[[nn.Module], nn.Module] | None = None,
                   ) -> tuple[object, list[PipelineStageModule]]:
    """Split ``graph``, build and initialize this rank's stages and the torch schedule that runs them.

    Args:
        graph: the model's IR graph.
        pp_rank: this process's rank in the pipeline group, 0..pp-1.
        pp: pipeline-parallel degree (``Plan.pp``); the size of ``group``.
        schedule: ``Plan.pp_schedule``, a key of :data:`SCHEDULES`.
        n_microbatches: micro-batches per step; the batch's dim 0 must divide by it.
        loss_fn: ``loss_fn(output, target) -> scalar``, called per micro-batch on the last stage.
        mask: the trunk's attention mask.
        device: device of this rank's stages.
        seed: ``lf_ir.materialize`` seed (the same as the single-process model's).
        group: the pipeline process group (default: the world).
        virtual_stages: stages per rank; only the interleaved schedules accept > 1.
        materialize: ``(module, device, seed) -> module``; default ``lf_ir.materialize``.
        side: names of the side tensors every stage takes after its first input (keys of
            :data:`SIDE_KWARGS`, e.g. ``("positions", "document_ids")``); ``()``: one tensor flows.
        scale_grads: the schedule divides gradients by ``n_microbatches`` (a mean loss per
            micro-batch); ``False`` for a ``loss_fn`` already normalized by the global batch.
        parallelize: ``(stage_module) -> module`` applied to each materialized stage before it is
            handed to the schedule (tensor parallel, recomputation, then DDP / FSDP2 on the sub-meshes
            of one pipeline rank); what it returns is the module the schedule runs.

    Returns:
        ``(schedule, stage_modules)``: the schedule (call :func:`pipeline_step`) and this
        rank's stage modules (unwrapped: a DDP wrapper's ``.module``; their parameters are what
        the optimizer updates, under the full model's names).

    Raises:
        ValueError: unknown schedule, ``virtual_stages > 1`` with ``gpipe`` / ``1f1b``,
            a bad ``pp_rank``, or a split that does not fit (see :func:`split_stages`).
    """
    check_schedule_args(schedule, pp_rank=pp_rank, pp=pp, virtual_stages=virtual_stages)
    if materialize is None:
        from lf_ir import materialize
    specs = [s for s in split_stages(graph, pp, virtual_stages=virtual_stages) if s.rank == pp_rank]
    modules, stages = [], []
    for spec in specs:
        with torch.device("meta"):
            module = build_stage_module(graph, spec, mask, side)
        module = materialize(module, device, seed)
        run = parallelize(module) if parallelize is not None else module
        modules.append(getattr(run, "module", run) if run is not module else module)
        stages.append(LfPipelineStage(run, spec.index, pp * virtual_stages, device, group=group))
    cls = SCHEDULES[schedule]
    sched = cls(stages[0] if schedule in _SINGLE_STAGE else stages, n_microbatches, loss_fn=loss_fn,
                scale_grads=scale_grads)
    return sched, modules


def pipeline_step(schedule, *, pp_rank: int, pp: int, inputs: Sequence[torch.Tensor],
                  target: torch.Tensor | None) -> list[torch.Tensor]:
    """Run one forward + backward of ``schedule`` over all micro-batches; returns the last stage's losses.

    The first pipeline rank feeds ``inputs`` (the first stage's positional inputs, full
    batch), the last rank feeds ``target`` (the second argument of ``loss_fn``, full
    batch); other ranks' arguments are ignored. Returns the per-micro-batch losses
    on the last rank, ``[]`` elsewhere. Gradients accumulate into the stage parameters.
    """
    losses: list[torch.Tensor] = []
    args = tuple(inputs) if pp_rank == 0 else ()
    if pp_rank == pp - 1:
        schedule.step(*args, target=target, losses=losses)
    else:
        schedule.step(*args)
    return losses
