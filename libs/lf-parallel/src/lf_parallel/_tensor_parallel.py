"""Tensor + sequence parallelism derived from the IR annotations, applied with DTensor ``parallelize_module``.

Nothing here knows a model family: the per-module plan is read from each lowered
module's ``lf_node`` (``lf_ir.lf_modules``). For every leaf node (one without
``children()``), ``tp_dims()`` says which parameter is split on which dim:

- a node with both column- (weight dim 0) and row-split (weight dim 1) linears is a
  Megatron pair (attention, MLP: Shoeybi et al., arXiv 1909.08053): its column
  linears get ``ColwiseParallel`` (local, head-sharded outputs), its row linears
  ``RowwiseParallel`` (all-reduce, or reduce-scatter to sequence shards under SP);
  attributes ``heads`` / ``kv_heads`` of the module become the local counts
  (``heads / tp``) so the head reshapes see the local width;
- a standalone column-split node (a vocabulary head) gathers its output, or keeps
  it vocab-sharded as a DTensor for :func:`vocab_parallel_loss` when it is the last
  node of its component (``loss_parallel=True``); a standalone row-split node
  (a vocab-parallel embedding, ``Embedding(tp="row")``) gets ``RowwiseParallel``;
- unsplit nodes stay plain replicated modules (identical on every tp rank).

Sequence parallel (Korthikanti et al., arXiv 2205.05198): in each component the
run of layers from the first token-mixing node (``seq_split == "context"``)
through the following context nodes and token-wise per-feature nodes (norms)
keeps the residual stream split along the sequence (dim 1). Norms there get
``SequenceParallel``; each Megatron pair all-gathers its input and reduce-scatters
its output. The run is entered by a reduce-scatter of a vocab-parallel
embedding or, otherwise, a local split inside the first layer's forward; it is
left into a sequence-gathering column head or, otherwise, by an all-gather.
Boundaries live in ``forward``, not in module hooks, so activation
recomputation of the first or last layer replays them (see :class:`_SeqBoundary`).

Layouts: ``x_bsd`` (batch, seq, dim); under SP the residual ``x_bsd`` between
modules is the local (batch, seq / tp, dim) shard.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from lf_ir import lf_modules
from lf_parallel._plan import Plan
from lf_parallel._tensor_parallel_extra import HeadShardedRMSNorm, TensorParallelGradSum


class _ColwiseAny(ColwiseParallel):
    """``ColwiseParallel`` for any module whose own parameters split on dim 0 (e.g. a vocabulary head
    multiplying by ``weight`` with ``F.linear``); a tied head with no own parameter only gets the
    input/output layouts (its weight is the already-sharded embedding's)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module, device_mesh, self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class _SeqNorm(SequenceParallel):
    """``SequenceParallel`` whose output is all-gathered to a full local tensor (the last node of an SP run)."""

    def __init__(self, gather: bool):
        super().__init__()
        self.gather = gather

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not self.gather:
            return super()._apply(module, device_mesh)
        return distribute_module(module, device_mesh, self._replicate_module_fn,
                                 partial(self._prepare_input_fn, self.sequence_sharding),
                                 lambda mod, out, mesh: _gather_seq(out, mesh))


class _SeqBoundary(ParallelStyle):
    """Sequence-parallel boundary of a module: split the full sequence of its first positional input into
    this rank's shard (``scatter``), all-gather the shards of its output (``gather``), or all-gather the
    input of a Megatron pair (``gather_input``: the DTensor stays, so the backward is one reduce-scatter).

    The boundary runs inside the module's own ``forward`` (an instance-level wrapper), not in module hooks:
    activation checkpointing saves a module's inputs and replays its ``forward``, so whatever the backend
    (lf-memory's wraps ``forward``; PyTorch's composable one re-enters ``__call__`` and its hooks) the
    replay starts from the same full input and splits it again, exactly as the forward did. As a hook, the
    split ran outside the saved inputs and a replayed hook split the already split input a second time
    (CheckpointError: saved (b, S, d) vs recomputed (b, S / tp, d)). Cost: a recomputed first layer keeps
    its full (b, S, d) input instead of the (b, S / tp, d) shard (one layer of the run).
    """

    def __init__(self, *, scatter: bool = False, gather: bool = False, gather_input: bool = False, where: str = ""):
        super().__init__()
        self.scatter, self.gather, self.gather_input, self.where = scatter, gather, gather_input, where

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not (self.scatter or self.gather_input or self.gather):
            return module
        inner_forward = module.forward
        scatter, gather, gather_input, where = self.scatter, self.gather, self.gather_input, self.where

        def forward(*args, **kwargs):
            if (scatter or gather_input) and not args:
                raise TypeError(f"sequence parallel in {where!r}: the (batch, seq, dim) input must be passed "
                                f"positionally, got keywords {sorted(kwargs)}")
            if not args:
                return _gather_seq(inner_forward(**kwargs), device_mesh) if gather else inner_forward(**kwargs)
            x = args[0]
            if scatter:
                if x.shape[1] % device_mesh.size():
                    raise ValueError(f"sequence parallel in {where!r}: sequence length {x.shape[1]} is not "
                                     f"divisible by tp={device_mesh.size()}")
                x = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
                x = x.redistribute(placements=[Shard(1)]).to_local()
            elif gather_input:
                if not isinstance(x, DTensor):
                    x = DTensor.from_local(x, device_mesh, [Shard(1)], run_check=False)
                x = x.redistribute(placements=[Replicate()])
            out = inner_forward(x, *args[1:], **kwargs)
            return _gather_seq(out, device_mesh) if gather else out

        module.forward = forward  # an instance attribute: no new submodule, state_dict keys unchanged
        return module


def _gather_seq(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
    return x.redistribute(placements=[Replicate()]).to_local()


def _weight_splits(node) -> dict[str, int | None]:
    """Owner path ("" for the module itself) -> the dim its weight splits on (None: replicated)."""
    out: dict[str, int | None] = {}
    for param, dim in node.tp_dims().items():
        owner, _, leaf = param.rpartition(".")
        if leaf == "weight" or owner not in out:
            out[owner] = dim if leaf == "weight" else out.get(owner)
    return out


def _token_wise(node) -> bool:
    """A node that acts on each token alone with per-feature parameters only (a norm)."""
    return node.seq_split == "local" and all(len(s) <= 1 for s in node.param_shapes().values()) \
        and all(d is None for d in node.tp_dims().values())


def _sp_run(nodes) -> tuple[int, int]:
    """[start, end) of the layers that run sequence parallel (empty when there is no token-mixing node)."""
    start = next((i for i, n in enumerate(nodes) if n.seq_split == "context"), None)
    if start is None:
        return 0, 0
    end = start
    while end < len(nodes) and (nodes[end].seq_split == "context" or _token_wise(nodes[end])):
        end += 1
    return start, end


def _leaf_styles(path: str, node, module: nn.Module, *, sp: bool, head_out: str) -> dict[str, ParallelStyle]:
    """The styles of one leaf node at ``path``; ``head_out`` is 'gather' or 'loss' for standalone column nodes."""
    splits = {o: d for o, d in _weight_splits(node).items() if d is not None}
    tied = getattr(node, "tied_to", None) is not None and getattr(node, "tp", None) == "column"
    styles: dict[str, ParallelStyle] = {}
    if not splits and not tied:
        if sp and _token_wise(node):
            styles[path] = SequenceParallel()
        elif sp and any(True for _ in module.parameters()):  # replicated conditioning (adaLN modulation)
            styles[path] = TensorParallelGradSum()
        return styles
    paired = 0 in splits.values() and 1 in splits.values()
    if paired and sp:
        styles[path] = _SeqBoundary(gather_input=True, where=path)
    for owner, dim in (splits or {"": 0}).items():
        sub_path = f"{path}.{owner}" if owner else path
        sub = module.get_submodule(owner) if owner else module
        embedding = isinstance(sub, nn.Embedding)
        if paired and dim == 0 and isinstance(sub, nn.RMSNorm):  # q/k norm across heads (Wan)
            styles[sub_path] = HeadShardedRMSNorm()
        elif paired:
            styles[sub_path] = ColwiseParallel() if dim == 0 else RowwiseParallel(
                output_layouts=Shard(1) if sp else Replicate())
        elif embedding:
            styles[sub_path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()) if dim == 0 \
                else ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        elif dim == 0:
            loss = head_out == "loss"
            style_cls = ColwiseParallel if isinstance(sub, nn.Linear) else _ColwiseAny
            styles[sub_path] = style_cls(input_layouts=Replicate(), output_layouts=Shard(-1) if loss else Replicate(),
                                         use_local_output=not loss)
        else:
            styles[sub_path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    return styles


def tensor_parallel_styles(model: nn.Module, plan: Plan, *, loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan (module path -> style) that :func:`apply_tensor_parallel` uses.

    Components whose tp (``plan.component_tp``) is 1 get no entry: they stay replicated.
    """
    styles: dict[str, ParallelStyle] = {}
    for comp_path, comp in model.named_modules():
        component = getattr(comp, "lf_component", None)
        if component is None or plan.component_tp(component.name) == 1:
            continue
        sp = plan.component_sp(component.name)
        nodes = component.nodes
        start, end = _sp_run(nodes) if sp else (0, 0)
        prefix = f"{comp_path}.layers" if comp_path else "layers"
        for i, layer in enumerate(comp.layers):
            head_out = "loss" if loss_parallel and i == len(nodes) - 1 else "gather"
            lowered = set()
            for sub_path, module, leaf in lf_modules(layer):
                lowered.add(sub_path)
                if callable(getattr(leaf, "children", None)):
                    continue
                path = f"{prefix}.{i}.{sub_path}" if sub_path else f"{prefix}.{i}"
                styles.update(_leaf_styles(path, leaf, module, sp=start <= i < end, head_out=head_out))
            if start <= i < end:
                styles.update(_block_norm_styles(f"{prefix}.{i}", layer, lowered))
        if end > start:
            _entry(styles, prefix, start)
            _exit(styles, prefix, end - 1, len(nodes))
    return styles


def _block_norm_styles(path: str, layer: nn.Module, lowered: set[str]) -> dict[str, ParallelStyle]:
    """Affine norms a composite block's lowering creates itself (no IR node, e.g. Wan's ``norm2``): under SP
    they see the sequence shard, so their parameters become replicated DTensors (gradients summed over tp)."""
    return {f"{path}.{name}": SequenceParallel(use_local_output=True) for name, sub in layer.named_children()
            if name not in lowered and isinstance(sub, (nn.LayerNorm, nn.RMSNorm))
            and any(True for _ in sub.parameters())}


def _entry(styles: dict, prefix: str, i: int) -> None:
    prev = styles.get(f"{prefix}.{i - 1}")
    if i > 0 and isinstance(prev, RowwiseParallel):
        prev.output_layouts = (Shard(1),)  # e.g. a vocab-parallel embedding reduce-scatters into sequence shards
    elif isinstance(styles.get(f"{prefix}.{i}"), _SeqBoundary):  # a standalone pair: its input is already full
        styles[f"{prefix}.{i}"].gather_input = False
    else:
        styles[f"{prefix}.{i}"] = _SeqBoundary(scatter=True, where=f"{prefix}.{i}")


def _exit(styles: dict, prefix: str, i: int, n_layers: int) -> None:
    nxt = styles.get(f"{prefix}.{i + 1}")
    if i + 1 < n_layers and isinstance(nxt, ColwiseParallel):
        nxt.input_layouts = (Shard(1),)  # a column-parallel head all-gathers the sequence itself
        return
    base = f"{prefix}.{i}"
    last = styles.get(base)
    if isinstance(last, SequenceParallel):
        styles[base] = _SeqNorm(gather=True)
    elif isinstance(last, _SeqBoundary):
        last.gather = True
    else:
        styles[base] = _SeqBoundary(gather=True, where=base)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: Plan, *,
                          loss_parallel: bool = True) -> nn.Module:
    """Shard ``model`` (a lowered lf model, materialized) over the 1-D ``tp_mesh`` as the IR annotates it.

    Args:
        model: module tree containing ``lf_ir.ComponentModule``s (each lowered module has ``lf_node``).
        tp_mesh: the ``tp`` dim of :func:`lf_parallel.build_mesh`.
        plan: gives each component's tp (1 or ``plan.tp``) and sequence parallel flag.
        loss_parallel: keep the logits of a column-parallel last node vocab-sharded (a DTensor);
            compute the loss and its backward inside :data:`loss_parallel_context`.

    Returns:
        ``model``, modified in place: split parameters are ``DTensor``s sharded on ``tp_mesh``.

    Raises:
        ValueError: a module's heads are not divisible by tp (run ``check_plan`` with the graph first),
            or, at run time, a sequence-parallel run sees a length not divisible by tp.
    """
    styles = tensor_parallel_styles(model, plan, loss_parallel=loss_parallel)
    for path, module, node in lf_modules(model):
        if any(p == path or p.startswith(path + ".") for p in styles):
            tp = tp_mesh.size()
            for attr in ("heads", "kv_heads"):
                total = getattr(node, attr, None)
                if isinstance(total, int) and isinstance(getattr(module, attr, None), int):
                    if total % tp:
                        raise ValueError(f"node {node.name!r}: {attr}={total} is not divisible by tp={tp}")
                    setattr(module, attr, total // tp)
    if styles:
        parallelize_module(model, tp_mesh, styles)
    return model


loss_parallel_context = loss_parallel
"""Context manager for a vocab-parallel loss: with ``loss_parallel=True`` the logits of a column-parallel
last node are a DTensor sharded on the vocabulary; ``cross_entropy`` on them, and the ``backward()`` of the
loss, must both run inside it (``torch.distributed.tensor.parallel.loss_parallel``): the softmax is
computed from per-shard maxima and sums, and the vocabulary is never gathered. Without DTensor logits
it changes nothing."""
