"""Memory per rank of a training step under a parallel plan, predicted from the IR.

What one rank holds at its peak (bytes), following ZeRO's accounting
(Rajbhandari et al., SC 2020) and Megatron-LM's activation analysis
(Korthikanti et al. 2022, arXiv 2205.05198):

- ``params``: float32 master weights of the rank's pipeline stage, tensor-parallel
  dims (``tp_dims``) divided by the component's tp, and, under ZeRO-3 (and ZeRO-2,
  whose FSDP2 form keeps parameters sharded at rest), each tensor's dim 0 sharded
  over ``dp_shard * cp`` with FSDP2's padding (``ceil(dim0 / shards)`` rows).
- ``grads``: float32, sharded like the parameters under ZeRO-2/3, whole otherwise.
- ``optimizer``: AdamW ``exp_avg`` and ``exp_avg_sq`` (8 bytes per element) plus a
  4-byte ``step`` per tensor; sharded under ZeRO-2/3 like the parameters and under
  ZeRO-1 over all ``dp * cp`` ranks (an even split; ``ZeroRedundancyOptimizer``
  partitions whole tensors, so its ranks differ by up to one tensor).
- ``compute_params``: low-precision working copies (bf16/fp16): autocast's weight
  casts kept for backward (ZeRO-0/1), FSDP2's gathered parameters kept from forward
  to backward (ZeRO-2, also in fp32).
- ``activations``: what autograd keeps for backward, from each node's
  ``saved_bytes`` (``lf_memory.block_saved_terms`` for transformer blocks, so
  recompute modes and the tp / sp split are per term), with the token dim divided by
  cp, times the micro-batches in flight on the stage: 1 without a pipeline,
  ``min(pp - stage, m)`` for 1F1B and zero-bubble, ``pp + (pp - 1) / v`` on stage 0
  for interleaved 1F1B (Narayanan et al. 2021), ``m`` for GPipe.
- ``temporaries``: the loss head's logits (in the compute dtype, their float32 copy
  and the float32 log-softmax: ``tokens * vocab / tp * (db + 8)``; an H200 run of
  ``bench/autotune_check.py`` ran out of memory allocating the float32 copy) on the last stage, what one
  block re-materializes while it is recomputed (its activations minus what it kept), and under ring context
  parallelism the score matrix of one masked ring block (:func:`lf_memory._estimate_rules.ring_block_scores`).
- ``comm_buffers``: DDP's gradient buckets (a copy of all gradients), FSDP2's
  gathered parameters of two blocks (current and prefetched, ZeRO-3) and one block's
  unsharded gradient before its reduce-scatter.

The peak (``total``) is the larger of two moments of the step, not the sum of every
kind: gradients are freed between steps (``zero_grad(set_to_none=True)``), so at the end
of the forward pass and the start of the backward pass a rank holds parameters,
optimizer state, working copies, all activations, temporaries and only the gradients
backward has written by then (``grads_in_flight``: the head's and the largest block's,
or all of them when micro-batches accumulate into them); at the optimizer step it holds
parameters, gradients and optimizer state while the activations are gone. Checked on one
H200 (``bench/memory_check.py``).

Not counted: the CUDA context, NCCL's own buffers and allocator fragmentation
(compare against ``torch.cuda.max_memory_allocated``, not ``nvidia-smi``).
Blocks other than transformer blocks (the DiT block, the joint block) use :mod:`lf_memory._estimate_rules`.
"""

from __future__ import annotations

import math
from functools import lru_cache

import msgspec

from lf_ir import LMHead

from ._estimate_graph import graph_view, is_block
from ._estimate_rules import node_saved, ring_block_scores
from ._recompute_modes import recompute_flags

__all__ = ["MemoryEstimate", "estimate_memory", "in_flight_micro_batches", "residual_stream_bytes"]

_OPTIMIZER_BYTES = {"adamw": 8, "adam": 8, "sgd": 0}
_ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class MemoryEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes one rank holds at its peak, by kind (see the module docstring)."""

    params: int
    """Parameter storage (float32 master weights), bytes."""
    grads: int
    """Gradients (float32), bytes."""
    optimizer: int
    """Optimizer state, bytes."""
    compute_params: int
    """Low-precision or gathered working copies of the parameters, bytes."""
    activations: int
    """Saved activations of the micro-batches in flight, bytes."""
    temporaries: int
    """Logits/loss and one recomputed block, bytes."""
    comm_buffers: int
    """Gradient buckets and gathered parameters of FSDP, bytes."""
    stage: int = 0
    """Pipeline stage these figures are for (the one with the highest total)."""
    grads_in_flight: int | None = None
    """Gradient bytes already written when the activations peak (start of backward); None: all of ``grads``."""

    @property
    def backward_peak(self) -> int:
        """Bytes held at the start of the backward pass: everything but the gradients not yet written."""
        grads = self.grads if self.grads_in_flight is None else self.grads_in_flight
        return (self.params + grads + self.optimizer + self.compute_params + self.activations
                + self.temporaries + self.comm_buffers)

    @property
    def optimizer_peak(self) -> int:
        """Bytes held at the optimizer step: parameters, gradients, optimizer state and buffers."""
        return self.params + self.grads + self.optimizer + self.comm_buffers

    @property
    def total(self) -> int:
        """Peak bytes: the larger of :attr:`backward_peak` and :attr:`optimizer_peak`."""
        return max(self.backward_peak, self.optimizer_peak)

    def breakdown(self) -> dict[str, int]:
        """Kind -> bytes, plus ``total``."""
        skip = ("stage", "grads_in_flight")
        return {**{k: getattr(self, k) for k in self.__struct_fields__ if k not in skip}, "total": self.total}


def in_flight_micro_batches(schedule: str, pp: int, stage: int, micro_batches: int, virtual: int = 1) -> float:
    """Micro-batches whose activations a pipeline stage holds at once (units: the stage's layers).

    Raises:
        ValueError: an unknown schedule.
    """
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(micro_batches)
    if schedule in ("1f1b", "zero_bubble"):
        return float(min(pp - stage, micro_batches))
    if schedule == "interleaved_1f1b":
        return min(pp - stage + (pp - 1 - stage) / virtual, float(micro_batches))
    raise ValueError(f"parallel.pp_schedule: unknown schedule {schedule!r}")


def _plan_value(plan, key: str, default):
    return default if plan is None else getattr(plan, key, default)


def residual_stream_bytes(plan, dtype_bytes: int) -> int:
    """Bytes per element of the residual stream a decoder's norms read on CUDA under ``plan``: ``dtype_bytes``
    when FSDP2 casts the parameters (``zero_stage >= 2`` with ``plan.precision`` bf16 / fp16:
    ``MixedPrecisionPolicy(param_dtype)``), else 4 (float32: autocast over float32 weights; ``plan`` None too).
    The ``stream_db`` of :func:`estimate_memory` and what callers pass to :func:`lf_memory.plan_recompute`."""
    fsdp_casts = _plan_value(plan, "zero_stage", 0) >= 2 and _plan_value(plan, "precision", "fp32") != "fp32"
    return dtype_bytes if fsdp_casts else 4


def _comp_tp(plan, name: str) -> tuple[int, bool]:
    if plan is None:
        return 1, False
    tp = plan.component_tp(name) if hasattr(plan, "component_tp") else plan.tp
    sp = plan.component_sp(name) if hasattr(plan, "component_sp") else bool(plan.sp) and tp > 1
    return tp, sp


def _local_numel(shape: tuple[int, ...], tp_dim: int | None, tp: int, shards: int) -> int:
    dims = list(shape)
    if tp_dim is not None and tp > 1:
        dims[tp_dim] = math.ceil(dims[tp_dim] / tp)
    if shards > 1 and dims:
        dims[0] = math.ceil(dims[0] / shards)
    return math.prod(dims)


@lru_cache(maxsize=65536)
def _param_elems(node, tp: int, shards: int) -> tuple[int, int]:
    shapes, split = node.param_shapes(), node.tp_dims()
    return sum(_local_numel(s, split.get(k), tp, shards) for k, s in shapes.items()), len(shapes)


def estimate_memory(graph, plan=None, *, batch: int | None = None, seq: int | None = None,
                    precision: str = "bf16", optimizer: str = "adamw", recompute: str = "none",
                    recompute_every: int = 2, stage: int | None = None,
                    kernels: str = "cuda") -> MemoryEstimate:
    """Peak memory of one rank in a training step (see the module docstring for each kind).

    Args:
        graph: the model's ``lf_ir.Graph``.
        plan: an ``lf_parallel.Plan`` (any object with its fields); None is one process.
        batch: samples per micro-batch (default ``plan.micro_batch``, else 1).
        seq: tokens per sample of the main component (the one with the most blocks);
            default its ``seq_len``. Other components keep their ``seq_len``.
        precision: ``"bf16"``, ``"fp16"`` (2-byte activations and weight copies) or ``"fp32"``.
        optimizer: ``"adamw"``, ``"adam"`` or ``"sgd"`` (no state).
        recompute: lf-memory's mode: ``"none"``, ``"full"``, ``"selective"`` or ``"every_k"``.
        recompute_every: the k of ``"every_k"``.
        stage: a pipeline stage; None returns the stage with the highest total.
        kernels: ``"cuda"`` (the default for planning: RMSNorms keep what ``aten::_fused_rms_norm`` saves,
            their input and a float32 rstd; a decoder's norms read the float32 residual stream of autocast
            over float32 weights, or the ``precision`` one when the plan's FSDP2 casts the parameters:
            ``zero_stage >= 2`` with ``plan.precision`` bf16 / fp16) or ``"cpu"`` (lf-ir's CPU rules exactly:
            what ``measure_saved_bytes`` sees on the CPU).

    Returns:
        A :class:`MemoryEstimate` in bytes.

    Raises:
        ValueError: unknown precision, optimizer, recompute mode, schedule or kernels, or a stage out of range.

    Example:
        >>> from lf_ir.recipes import llama3
        >>> g = llama3.build_graph(llama3.llama3_config("tiny"), 32)
        >>> estimate_memory(g, precision="fp32").params == 4 * 119_104
        True
    """
    if precision not in _ACT_BYTES:
        raise ValueError(f"precision must be one of {sorted(_ACT_BYTES)}, got {precision!r}")
    if optimizer not in _OPTIMIZER_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZER_BYTES)}, got {optimizer!r}")
    if kernels not in ("cpu", "cuda"):
        raise ValueError(f"kernels must be 'cpu' or 'cuda', got {kernels!r}")
    recompute_flags(0, recompute, every=recompute_every)  # validates the mode
    pp = _plan_value(plan, "pp", 1)
    if stage is not None and not 0 <= stage < pp:
        raise ValueError(f"stage must be in [0, {pp}), got {stage}")
    stages = [stage] if stage is not None else sorted({0, pp - 1})
    best = None
    for s in stages:
        est = _stage_estimate(graph, plan, s, batch, seq, precision, optimizer, recompute, recompute_every,
                              kernels)
        if best is None or est.total > best.total:
            best = est
    return best


def _stage_estimate(graph, plan, stage, batch, seq, precision, optimizer, recompute, every,
                    kernels) -> MemoryEstimate:
    view = graph_view(graph)
    pp = _plan_value(plan, "pp", 1)
    zero = _plan_value(plan, "zero_stage", 0)
    cp = _plan_value(plan, "cp", 1)
    dp = _plan_value(plan, "dp", 1)
    shards = _plan_value(plan, "dp_shard", 1) * cp if zero >= 2 else 1
    micro = batch or _plan_value(plan, "micro_batch", 1)
    db = _ACT_BYTES[precision]
    stream_db = residual_stream_bytes(plan, db)
    elems = full_elems = tensors = biggest_block = head_elems = 0
    acts = temps = recompute_peak = ring_peak = 0.0
    ring = cp > 1 and _plan_value(plan, "cp_kind", "ring") == "ring"
    for comp in view.components:
        tp, sp = _comp_tp(plan, comp.name)
        blocks, others = view.stage_nodes(comp, stage, pp)
        tokens_seq = seq if (seq and comp.name == view.main) else comp.seq_len
        for node, count in (blocks + others).items():
            e, t = _param_elems(node, tp, shards)
            elems, tensors = elems + count * e, tensors + count * t
            full_elems += count * _param_elems(node, tp, 1)[0]
            if is_block(node):
                biggest_block = max(biggest_block, _param_elems(node, tp, 1)[0])
            if isinstance(node, LMHead):
                head_elems += count * e
        for node, count in others.items():
            acts += count * node_saved(node, micro, tokens_seq, db, "none", tp, sp, cp, kernels, stream_db)
            if isinstance(node, LMHead):
                temps += micro * tokens_seq / cp * node.vocab_size / tp * (db + 8)
        flags = recompute_flags(len(comp.blocks), recompute, every=every)
        ratio = sum(flags) / len(flags) if flags else 0.0
        block_mode = "selective" if recompute == "selective" else "full"
        for node, count in blocks.items():
            plain = node_saved(node, micro, tokens_seq, db, "none", tp, sp, cp, kernels, stream_db)
            kept = node_saved(node, micro, tokens_seq, db, block_mode, tp, sp, cp, kernels, stream_db)
            acts += count * (ratio * kept + (1 - ratio) * plain)
            if ratio:
                recompute_peak = max(recompute_peak, plain - kept)
            if ring:
                ring_peak = max(ring_peak, ring_block_scores(node, micro, tokens_seq, cp, tp))
    schedule = _plan_value(plan, "pp_schedule", "1f1b")
    m = _plan_value(plan, "grad_accum", 1)
    flight = in_flight_micro_batches(schedule, pp, stage, m, _plan_value(plan, "pp_virtual_stages", 1))
    opt_shards = shards if zero >= 2 else (dp * cp if zero == 1 else 1)
    opt_elems = elems if zero >= 2 else math.ceil(full_elems / opt_shards)
    opt_tensors = tensors if zero != 1 else math.ceil(tensors / opt_shards)
    per_elem = _OPTIMIZER_BYTES[optimizer]
    compute = 0
    if zero == 2:
        compute = full_elems * db
    elif zero < 2 and precision != "fp32":
        compute = full_elems * db
    comm = 0
    if zero >= 2 and shards > 1:
        comm = biggest_block * (db + 4) + (2 * biggest_block * db if zero == 3 else 0)
    elif zero < 2 and dp * cp > 1:
        comm = full_elems * 4
    accumulating = m > 1 or pp > 1  # later micro-batches run forward with the gradients already allocated
    first_grads = head_elems + math.ceil(biggest_block * elems / max(full_elems, 1))
    return MemoryEstimate(
        grads_in_flight=None if accumulating else min(elems, first_grads) * 4,
        params=elems * 4, grads=elems * 4, optimizer=opt_elems * per_elem + (opt_tensors * 4 if per_elem else 0),
        compute_params=compute, activations=int(round(acts * flight)),
        temporaries=int(round(temps + recompute_peak + ring_peak)),
        comm_buffers=comm, stage=stage)
