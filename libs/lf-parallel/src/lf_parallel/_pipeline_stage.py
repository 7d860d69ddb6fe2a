"""The ``PipelineStage`` lf builds: zero-bubble's split backward differentiates the parameters the forward used.

Zero-bubble schedules (Qi et al., ICLR 2024) split each micro-batch's backward into an input-gradient pass
(``I``, on the critical path) and a weight-gradient pass (``W``, run later to fill bubbles). torch's
``PipelineStage`` finds the weights of both passes as ``stage.submod.parameters()`` at the time the pass
runs. Under FSDP2 with ``reshard_after_forward=True`` (ZeRO-3) a block's module holds its *sharded*
parameters between its forward and its backward; the autograd graph of the forward holds the *unsharded*
ones (FSDP2 keeps one unsharded ``nn.Parameter`` per parameter and registers it only while gathered). So
the sharded parameters are not in the graph, the input pass saves no intermediate gradients for the
blocks' weights, and the weight pass leaves the gradients of every resharded block at zero while
the root's (embedding, final norm, head: not resharded after forward) are right: a wrong gradient,
silently (torch 2.13). ZeRO-2 (``reshard_after_forward=False``) keeps the unsharded parameters
registered, and full-backward schedules (``gpipe``, ``1f1b``, ``interleaved_1f1b``) accumulate through
autograd's own ``AccumulateGrad`` nodes, so neither is affected.

:class:`LfPipelineStage` takes the weights of the split passes from the autograd graph instead: the
leaves (``AccumulateGrad`` nodes) the stage's outputs reach, other than the stage's inputs, i.e. exactly
the parameter tensors the forward computed with, whatever a wrapper registered on the module since.
FSDP2's own accounting is unchanged: the gradients land in the unsharded parameters' ``.grad``, and the
schedule's final ``REDUCE_GRAD`` action (``perform_reduce_grad``) runs FSDP's post-backward, which
accumulates and reduce-scatters them into the sharded gradients, as after a full backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._backward import (
    _get_grad_fn_or_grad_acc,
    stage_backward_input,
    stage_backward_weight,
)

__all__ = ["LfPipelineStage", "graph_parameters"]


def graph_parameters(outputs, inputs) -> list[torch.Tensor]:
    """The leaf tensors requiring gradient that ``outputs``' autograd graph reaches, ``inputs`` excluded.

    Args:
        outputs: tensors (a stage's outputs, or the loss on the last stage); ones without a graph are skipped.
        inputs: the stage's input values (tensors or other objects); their own leaves are not returned.

    Returns:
        The leaves (each ``AccumulateGrad`` node's variable) in the order a depth-first walk from the
        outputs meets them, each once.
    """
    roots = [_get_grad_fn_or_grad_acc(t) for t in outputs
             if isinstance(t, torch.Tensor) and (t.requires_grad or t.grad_fn is not None)]
    skip = {_get_grad_fn_or_grad_acc(t) for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad}
    seen: set = set()
    stack = [r for r in roots if r is not None]
    params: list[torch.Tensor] = []
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf
        if variable is not None:
            if node not in skip:
                params.append(variable)
            continue
        stack.extend(fn for fn, _ in node.next_functions if fn is not None and fn not in seen)
    return params


class LfPipelineStage(PipelineStage):
    """``torch.distributed.pipelining.PipelineStage`` whose split backward under FSDP2 is exact.

    Same arguments and behaviour as ``PipelineStage``; for an ``FSDPModule`` stage the zero-bubble input
    and weight passes differentiate the parameters the forward's graph holds (:func:`graph_parameters`),
    not ``submod.parameters()`` (the sharded ones under ZeRO-3). Full backward passes are torch's.
    """

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False,
                                   ) -> tuple[tuple[torch.Tensor | None, ...], list[dict[str, Any]] | None]:
        if backward_type == "full" or not isinstance(self.submod, FSDPModule):
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward=last_backward)
        # as torch's FSDP branch: accumulate unsharded gradients; REDUCE_GRAD reduce-scatters them at the end
        self.submod.set_is_last_backward(False)
        self.submod.set_reshard_after_backward(False)
        self.submod.set_requires_gradient_sync(False)
        if backward_type == "input":
            outputs = bwd_kwargs["stage_output"]
            outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
            weights = graph_parameters(outputs, bwd_kwargs["input_values"])
            return stage_backward_input(outputs, bwd_kwargs["output_grads"], bwd_kwargs["input_values"],
                                        iter(weights))
        if backward_type == "weight":
            # the weights the input pass grouped: each group's "params" are their AccumulateGrad nodes
            weights = [node.variable for group in bwd_kwargs["param_groups"] for node in group["params"]]
            return stage_backward_weight(iter(weights), bwd_kwargs["param_groups"]), None
        raise RuntimeError(f"unknown backward type {backward_type!r}")
