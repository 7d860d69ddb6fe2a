"""Pipeline parallelism for multi-component models (VLM, VLA, video DiT): stages that run the recipe's glue.

:func:`lf_parallel._stages.split_stages` puts every non-trunk component (vision
tower, text encoder of a DiT, state projection) on stage 0. Merging their outputs
into the trunk's sequence (image tokens into text, M-RoPE / 3D positions, timestep
conditioning) is model-specific, so it stays in the recipe: the recipe's model
class provides the three methods of :mod:`lf_ir._pipeline_glue`
(``embed_inputs``, ``trunk_blocks``, ``trunk_head``) and a stage here only calls
them, with no model-specific code:

- stage 0: ``embed_inputs(*inputs)`` then its trunk blocks, returns ``(hidden_bsd, *side)``;
- a middle stage: ``forward(hidden_bsd, *side) -> (hidden_bsd, *side)``;
- the last stage: its blocks then ``trunk_head``, returns the model's output.

``side`` holds per-micro-batch tensors every block needs (M-RoPE ids (batch, 3, seq),
key padding, the DiT's text context, time modulation and RoPE tables), all with the
sample on dim 0 so ``torch.distributed.pipelining``'s schedules cut and send them
like the hidden states. Side tensors that depend on parameters (a DiT's text
context and timestep embedding) carry their gradients back to stage 0.

A stage is the recipe's own model built on the meta device with the layers and
components other stages run replaced or removed, so parameters keep the full
model's names and ``lf_ir.materialize`` gives every stage the single-process weights.
Schedules, micro-batching and gradient scaling are those of
:mod:`lf_parallel._pipeline`.

Legend: ``x_bsd`` (batch, seq, dim).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lf_ir import PIPELINE_GLUE, LMHead
from lf_parallel._pipeline import _SINGLE_STAGE, SCHEDULES, check_schedule_args
from lf_parallel._pipeline_stage import LfPipelineStage
from lf_parallel._stages import StageSpec, split_stages

__all__ = ["MultimodalStageModule", "build_multimodal_pipeline"]


class MultimodalStageModule(nn.Module):
    """One pipeline stage of a multi-component recipe model.

    Args:
        model: the whole recipe model (e.g. ``Qwen2VLModel``, ``VLAModel``, ``WanDiTModel``), built on
            the meta device, with a ``graph`` attribute, its lowered components in ``model.components``
            and the methods of :mod:`lf_ir._pipeline_glue`. The stage takes it over: trunk layers
            outside ``[spec.start, spec.stop)`` become ``nn.Identity`` and components other than the
            trunk and ``spec.encoders`` are removed.
        spec: this stage (from :func:`lf_parallel._stages.split_stages` on ``model.graph``).

    Parameters keep the full model's names (``components.<component>.layers.<i>.*``).

    Raises:
        TypeError: the model lacks a glue method or has parameters outside ``model.components``.
        ValueError: the stage holds a head tied to an embedding on another stage.
    """

    def __init__(self, model: nn.Module, spec: StageSpec):
        super().__init__()
        name = type(model).__name__
        missing = [m for m in PIPELINE_GLUE if not callable(getattr(model, m, None))]
        if missing:
            raise TypeError(f"{name} cannot be pipelined: it has no {missing} (the pipeline glue of "
                            "lf_ir._pipeline_glue: embed_inputs, trunk_blocks, trunk_head)")
        own = [n for n, _ in [*model.named_parameters(), *model.named_buffers()] if not n.startswith("components.")]
        if own or [n for n, _ in model.named_children() if n != "components"]:
            raise TypeError(f"{name} cannot be pipelined: parameters or submodules outside model.components "
                            f"({own[:3] or [n for n, _ in model.named_children() if n != 'components']})")
        nodes = model.graph.component(spec.trunk).nodes
        for i, node in enumerate(nodes[spec.start:spec.stop], start=spec.start):
            if isinstance(node, LMHead) and node.tied_to is not None:
                tied = next(j for j, n in enumerate(nodes) if n.name == node.tied_to)
                if not spec.start <= tied < spec.stop:
                    raise ValueError(f"stage {spec.index}: head {node.name!r} (node {i}) is tied to "
                                     f"{node.tied_to!r} (node {tied}) on another pipeline stage; untie the "
                                     "embeddings (model.tie_embeddings=false) to pipeline this model")
        trunk = model.components[spec.trunk]
        for i in range(len(trunk.layers)):
            if not spec.start <= i < spec.stop:
                trunk.layers[i] = nn.Identity()
        for comp in list(model.components):
            if comp != spec.trunk and comp not in spec.encoders:
                del model.components[comp]
        self.spec = spec
        self.is_first = spec.index == 0
        self.is_last = spec.stop == len(nodes)
        self.components = model.components  # the model's own ModuleDict: materialize and optimizers see it
        self._model = [model]  # a plain list: the model is not a second owner of the parameters

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Stage 0: the model's inputs (as ``embed_inputs`` takes them); later stages: ``(hidden_bsd, *side)``.

        Returns ``(hidden_bsd, *side)``, or on the last stage the model's output (``trunk_head``).
        """
        model = self._model[0]
        hidden, *side = model.embed_inputs(*args) if self.is_first else args
        hidden = model.trunk_blocks(hidden, *side, start=self.spec.start, stop=self.spec.stop)
        if self.is_last:
            return model.trunk_head(hidden, *side)
        return tuple(_sendable(t) for t in (hidden, *side))


def _sendable(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a stage output: contiguous for the send (expanded RoPE tables are not) and neither a view
    nor a received tensor passed through when it needs a gradient (the zero-bubble schedules detach stage
    outputs in place, and a passed-through leaf would detach this stage's input)."""
    if t._is_view() or not t.is_contiguous() or (t.requires_grad and t.grad_fn is None):
        return t.clone(memory_format=torch.contiguous_format)
    return t


def build_multimodal_pipeline(build_model: Callable[[], nn.Module], *, pp_rank: int, pp: int, schedule: str,
                              n_microbatches: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                              device: torch.device, seed: int, group=None, virtual_stages: int = 1,
                              materialize: Callable[[nn.Module, torch.device, int], nn.Module] | None = None,
                              scale_grads: bool = True, parallelize: Callable[[nn.Module], nn.Module] | None = None,
                              ) -> tuple[object, list[MultimodalStageModule]]:
    """Split a multi-component model, build and initialize this rank's stages and the schedule that runs them.

    Args:
        build_model: ``() -> model``: builds the whole recipe model (called under the meta device,
            once per stage of this rank), e.g. ``lambda: Qwen2VLModel(cfg, graph)``.
        pp_rank: this process's rank in the pipeline group, 0..pp-1.
        pp: pipeline-parallel degree (``Plan.pp``); the size of ``group``.
        schedule: ``Plan.pp_schedule``, a key of :data:`lf_parallel._pipeline.SCHEDULES`.
        n_microbatches: micro-batches per step; every input's dim 0 must divide by it.
        loss_fn: ``loss_fn(output, target) -> scalar``, per micro-batch on the last stage.
        device: device of this rank's stages.
        seed: ``lf_ir.materialize`` seed (the same as the single-process model's).
        group: the pipeline process group (default: the world).
        virtual_stages: stages per rank; only the interleaved schedules accept > 1.
        materialize: ``(module, device, seed) -> module``; default ``lf_ir.materialize``.
        scale_grads: divide gradients by ``n_microbatches`` (a mean loss per micro-batch); ``False`` for a
            ``loss_fn`` already normalized by the global batch.
        parallelize: ``(stage_module) -> module`` applied to each materialized stage before the schedule gets it
            (tensor parallel, recomputation, then FSDP2 on the sub-meshes of one pipeline rank), as in
            :func:`lf_parallel._pipeline.build_pipeline`.

    Returns:
        ``(schedule, stage_modules)``; run a step with :func:`lf_parallel._pipeline.pipeline_step`
        (``inputs``: the model's forward inputs, each cut along dim 0). The modules are unwrapped (their
        parameters are what the optimizer updates, under the full model's names).

    Raises:
        ValueError: unknown schedule, ``virtual_stages > 1`` with ``gpipe`` / ``1f1b``, a bad
            ``pp_rank``, a split that does not fit (see :func:`split_stages`), or a tied head.
        TypeError: the model has no pipeline glue.
    """
    check_schedule_args(schedule, pp_rank=pp_rank, pp=pp, virtual_stages=virtual_stages)
    if materialize is None:
        from lf_ir import materialize
    modules, stages = [], []
    for spec in (s for s in _split(build_model, pp, virtual_stages) if s.rank == pp_rank):
        with torch.device("meta"):
            module = MultimodalStageModule(build_model(), spec)
        module = materialize(module, device, seed)
        run = parallelize(module) if parallelize is not None else module
        modules.append(getattr(run, "module", run) if run is not module else module)
        stages.append(LfPipelineStage(run, spec.index, pp * virtual_stages, device, group=group))
    cls = SCHEDULES[schedule]
    sched = cls(stages[0] if schedule in _SINGLE_STAGE else stages, n_microbatches, loss_fn=loss_fn,
                scale_grads=scale_grads)
    return sched, modules


def _split(build_model: Callable[[], nn.Module], pp: int, virtual_stages: int) -> list[StageSpec]:
    with torch.device("meta"):
        graph = build_model().graph
    return split_stages(graph, pp, virtual_stages=virtual_stages)
