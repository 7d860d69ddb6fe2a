"""Predicted step time of a plan from the IR: compute per node, exposed communication, bubbles, optimizer.

Per node and micro-batch on one rank (``T`` local tokens, FLOPs from the node's
``forward_flops``, split into the part linear in ``seq`` (matmuls) and the part
quadratic in it (the attention core: ``(f(2s) - 2 f(s)) / 2``)):

- matmuls: forward FLOPs / matmul rate, backward twice that; divided by tp when
  the node has tensor-parallel weights and by cp when its tokens split;
- attention core: the FLOPs the mask keeps (causal ~1/2) x 3.5 for forward +
  backward, at the calibrated attention rate of its mask class;
- element-wise traffic: ``elementwise_share`` of ``forward_bytes`` at the copy rate
  (twice in backward), plus ``kernel_overhead_us`` per pass;
- every compute rate is scaled by the calibration's ``model_efficiency``;
- recompute: full repeats the block's forward, selective its element-wise part.

Communication (:mod:`lf_parallel._comm_model`): TP all-reduces (or SP all-gather +
reduce-scatter) per row-parallel projection in forward, backward and recompute,
on the critical path; ring CP passes K/V ``cp - 1`` times (hidden behind the
attention core when shorter), Ulysses CP four all-to-alls per pass (exposed); PP
sends activations and their gradients between stages (exposed); DP per ZeRO
stage (ZeRO-0: gradient all-reduce, overlapped with the last backward; ZeRO-1: +
parameter all-gather after the step; ZeRO-2: per micro-batch parameter all-gather
+ gradient reduce-scatter; ZeRO-3: two all-gathers + reduce-scatter; HSDP: +
all-reduce of the shards across replicas), hidden behind 80% of the micro-batch's
compute except one block's share. The optimizer (fused AdamW) reads and writes
28 bytes per local parameter element at the copy rate.

    step = m * t_stage + bubble(schedule) * t_stage + exposed DP + optimizer

with ``t_stage`` the slowest stage's micro-batch time. Its compute part is the GPU time or the host time of
launching its kernels, whichever sets the pace (:mod:`lf_parallel._host_cost`: launches counted per block type,
priced per launch; per pass when the model syncs inside each micro-batch). Packed multimodal rows
(:mod:`lf_parallel._mm_cost`): the attention core of a per-image vision tower is divided by ``images_per_sample``
and that of the decoder by ``docs_per_sample``, and each attention segment costs host overhead per block and pass.
MFU follows BENCH.md: the IR's dense-attention forward + backward FLOPs per token over the GPU's bf16 peak.
"""

from __future__ import annotations

from functools import lru_cache

import msgspec

from lf_memory import MemoryEstimate, estimate_memory, graph_view, is_block, recompute_flags
from lf_parallel._calibrate import Calibration, default_calibration
from lf_parallel._cluster import Cluster
from lf_parallel._comm_model import bubble_micro_batches, collective_time, mesh_strides
from lf_parallel._host_cost import host_pass_s, overlap_step, stage_launches
from lf_parallel._mm_cost import packed_components, per_image_components, segment_overhead_s, segments

_DB = {"fp32": 4, "bf16": 2, "fp16": 2}
_OVERLAP = 0.8


class StepCost(msgspec.Struct, frozen=True, kw_only=True):
    """Predicted time of one optimizer step on the slowest rank, and what it is made of (seconds)."""

    step_s: float
    """Whole step."""
    compute_s: float
    """Forward + backward compute of all micro-batches on the slowest stage (no recompute)."""
    recompute_s: float
    """Forward work repeated by activation recomputation."""
    exposed_comm_s: float
    """Communication not hidden behind compute (sum of ``comm``)."""
    bubble_s: float
    """Pipeline idle time."""
    optimizer_s: float
    """Optimizer step."""
    comm: dict[str, float]
    """Exposed communication by mesh dim: ``tp``, ``cp``, ``pp``, ``dp``."""
    tokens_per_s_per_gpu: float
    """Main-component tokens per second per GPU."""
    tflops_per_gpu: float
    """Model FLOPs (dense attention, no recompute) per second per GPU, TFLOP/s."""
    mfu: float
    """Model FLOPs utilization against the GPU's bf16 peak."""
    memory: MemoryEstimate
    """Peak memory per GPU (lf-memory's estimate)."""
    host_s: float = 0.0
    """Host and launch overhead of attention run segment by segment, all micro-batches (:mod:`lf_parallel._mm_cost`)."""
    launch_host_s: float = 0.0
    """Host time issuing the kernels of all micro-batches (:mod:`lf_parallel._host_cost`); it overlaps the GPU
    work, so the step holds ``compute_s + recompute_s`` or this, whichever sets the pace, not their sum."""
    launches: float = 0.0
    """Predicted kernel launches of one step (all micro-batches; the optimizer's in the per-node share)."""


def _attention_of(node):
    for key in ("attention", "self_attn"):
        child = getattr(node, key, None)
        if child is not None:
            return child
    return node if "attention" in type(node).__name__.lower() else None


def _mask_class(node, seq: int) -> tuple[str, float]:
    att = _attention_of(node)
    mask = getattr(att, "mask", "full")
    kind = mask if isinstance(mask, str) else getattr(mask, "kind", "masked")
    if kind == "causal":
        return "causal", (seq + 1) / (2 * seq)
    if kind == "full":
        return "full", 1.0
    keep = getattr(att, "keep_fraction", None)
    return "masked", keep(seq) if keep is not None else 1.0


def _row_parallel(node) -> int:
    return sum(1 for key, dim in node.tp_dims().items() if dim == 1 and key.endswith("weight"))


@lru_cache(maxsize=65536)
def _node_work(node, batch: int, seq: int, cp: int, tp: int, sp: bool, db: int) -> tuple:
    """(matmul fwd FLOPs, kept attention fwd FLOPs, mask class, fwd element-wise bytes, tp collectives, kv width)."""
    f1, f2 = node.forward_flops(batch, seq), node.forward_flops(batch, 2 * seq)
    quad = max((f2 - 2 * f1) / 2, 0.0)
    lin = f1 - quad
    split = cp if node.seq_split != "none" else 1
    has_tp = tp > 1 and any(d is not None for d in node.tp_dims().values())
    tdiv = tp if has_tp else 1
    cls, keep = _mask_class(node, seq) if quad else ("full", 1.0)
    local = max(seq // split, 1)
    try:
        traffic = node.forward_bytes(batch, local, db)
    except (AttributeError, NotImplementedError, TypeError):
        traffic = 2 * batch * local * node.out_dim * db * (10 if is_block(node) else 1)
    traffic = traffic / tp if (sp and tp > 1) else traffic * (0.5 + 0.5 / tdiv)
    att = _attention_of(node) if is_block(node) else None
    kv = getattr(att, "kv_heads", getattr(att, "heads", 1)) * getattr(att, "head_dim", 0) if att else 0
    return lin / split / tdiv, quad * keep / split / tdiv, cls, traffic, _row_parallel(node) if has_tp else 0, kv


@lru_cache(maxsize=4096)
def _params(node, tp: int) -> int:
    shapes, dims = node.param_shapes(), node.tp_dims()
    total = 0
    for key, shape in shapes.items():
        n = 1
        for s in shape:
            n *= s
        total += n // tp if dims.get(key) is not None and tp > 1 else n
    return total


def train_flops_per_sample(graph, seq: int | None = None) -> float:
    """Forward + backward FLOPs of one sample (dense attention), the main component at ``seq`` tokens."""
    view = graph_view(graph)
    total = 0.0
    for comp, cv in zip(graph.components, view.components, strict=True):
        s = seq if (seq and cv.name == view.main) else comp.seq_len
        total += sum(3 * n.forward_flops(1, s) for n in comp.nodes)
    return total


def step_cost(graph, plan, cluster: Cluster, *, recompute: str | dict[str, str] = "none", precision: str = "bf16",
              seq: int | None = None, calibration: Calibration | None = None,
              memory: MemoryEstimate | None = None, images_per_sample: float = 1.0,
              docs_per_sample: float = 1.0) -> StepCost:
    """Predicted step time, throughput and peak memory of ``plan`` on ``cluster`` (see the module docstring).

    Args:
        graph: the model's ``lf_ir.Graph``.
        plan: a checked ``lf_parallel.Plan`` (``plan.world_size`` GPUs of ``cluster``).
        cluster: GPUs and links.
        recompute: lf-memory's recompute mode for every block, or a mode per component name (missing: ``none``;
            the memory estimate then uses the main component's mode).
        precision: compute dtype ``bf16``, ``fp16`` or ``fp32`` (fp32 runs matmuls at half the rate).
        seq: tokens per sample of the main component (default its ``seq_len``).
        calibration: achieved rates (default :func:`default_calibration` of the cluster's GPU).
        memory: a precomputed estimate (else :func:`lf_memory.estimate_memory`).
        images_per_sample: images in one sample of a per-image vision component (a packed row's images; its
            ``seq_len`` is their patches together), see :mod:`lf_parallel._mm_cost`.
        docs_per_sample: documents packed into one sample of the main component (attention stays inside each).

    Raises:
        ValueError: unknown precision, recompute mode or schedule.
    """
    if precision not in _DB:
        raise ValueError(f"precision must be one of {sorted(_DB)}, got {precision!r}")
    cal = calibration or default_calibration(cluster.gpu)
    view, db = graph_view(graph), _DB[precision]
    slow = 2.0 if precision == "fp32" else 1.0
    eff = cal.model_efficiency
    mm_rate, bw = eff * cal.matmul_tflops * 1e12 / slow, eff * cal.copy_tbps * 1e12
    over = cal.kernel_overhead_us * 1e-6
    strides, mb, cp = mesh_strides(plan), plan.micro_batch, plan.cp

    def coll(kind, nbytes, ranks, dim):
        return collective_time(kind, nbytes, ranks, cluster=cluster, calibration=cal, span=strides[dim] * ranks)

    per_image = per_image_components(graph)
    packed = packed_components(graph, view.main, per_image)
    modes = recompute if isinstance(recompute, dict) else {}
    worst = None
    for stage in sorted({0, plan.pp - 1}):
        fwd = bwd = rc = tp_c = cp_c = host = h_fwd = h_bwd = n_launch = 0.0
        elems = blocks_on_stage = 0
        width = 0
        for comp in view.components:
            tp, sp = plan.component_tp(comp.name), plan.component_sp(comp.name)
            s = seq if (seq and comp.name == view.main) else comp.seq_len
            mode = modes.get(comp.name, "none") if modes else recompute
            flags = recompute_flags(len(comp.blocks), mode)
            segs = segments(comp.name, packed, per_image, images_per_sample, docs_per_sample)
            ratio = sum(flags) / len(flags) if flags else 0.0
            blocks, others = view.stage_nodes(comp, stage, plan.pp)
            launches = stage_launches(blocks, sum(others.values()), mode, ratio)
            hf, hb = host_pass_s(launches, mode == "selective", cal)
            h_fwd, h_bwd, n_launch = h_fwd + hf, h_bwd + hb, n_launch + sum(launches)
            host += segment_overhead_s(comp.name, packed, per_image, segs, mb, sum(blocks.values()),
                                       2 + (ratio if mode in ("full", "every_k") else 0),
                                       cal.host_overhead_us_per_segment)
            for node, count in (blocks + others).items():
                mm, attn, cls, traffic, rows, kv = _node_work(node, mb, s, cp, tp, sp, db)
                attn /= segs
                rate = eff * cal.attention_tflops.get(cls, cal.attention_tflops["full"]) * 1e12 / slow
                elem = cal.elementwise_share * traffic / bw
                f = mm / mm_rate + attn / rate + elem + over
                fwd += count * f
                bwd += count * (2 * mm / mm_rate + 2.5 * attn / rate + 2 * elem + over)
                elems += count * _params(node, tp)
                if not is_block(node):
                    continue
                blocks_on_stage += count
                width = max(width, node.out_dim)
                rc += count * ratio * (f if mode == "full" or mode == "every_k" else elem + over)
                act = mb * s / cp * node.out_dim * db
                if rows:
                    one = coll("all_gather", act, tp, "tp") + coll("reduce_scatter", act, tp, "tp") if sp \
                        else coll("all_reduce", act, tp, "tp")
                    tp_c += count * rows * one * (2 + (ratio if mode in ("full", "every_k") else 0))
                if cp > 1 and kv:
                    local = mb * s / cp
                    if plan.cp_kind == "ring":
                        ring = (cp - 1) * coll("p2p", 2 * local * kv * db / tp, cp, "cp")
                        cp_c += count * max(0.0, 3 * ring - attn * 3.5 / rate)
                    else:
                        cp_c += count * 8 * coll("all_to_all", local * (node.out_dim + kv) * db / tp, cp, "cp")
        pp_c = 0.0
        if plan.pp > 1:
            msg = mb * (seq or view.component(view.main).seq_len) / cp * width * db
            pp_c = 2 * plan.pp_virtual_stages * coll("p2p", msg / (plan.component_tp(view.main) if plan.sp else 1),
                                                     2, "pp")
        busy = overlap_step([fwd, bwd + rc], [h_fwd, h_bwd], synced=bool(per_image))
        t_mb = busy + tp_c + cp_c + pp_c + host
        cand = (t_mb, fwd, bwd, rc, tp_c, cp_c, pp_c, elems, max(blocks_on_stage, 1), host, h_fwd + h_bwd, n_launch)
        if worst is None or t_mb > worst[0]:
            worst = cand
    t_mb, fwd, bwd, rc, tp_c, cp_c, pp_c, elems, nblocks, host, launch_host, n_launch = worst
    m = plan.grad_accum
    dp_c = _dp_exposed(plan, elems, db, fwd + bwd, bwd, m, nblocks, coll)
    memory = memory or estimate_memory(graph, plan, seq=seq, precision=precision,
                                       recompute=modes.get(view.main, "none") if modes else recompute)
    opt_elems = (elems / (plan.dp_shard * cp) if plan.zero_stage >= 2
                 else elems / (plan.dp * cp) if plan.zero_stage == 1 else elems)
    optimizer = opt_elems * 28 / (bw / eff)
    bubble = bubble_micro_batches(plan.pp_schedule, plan.pp, plan.pp_virtual_stages) * t_mb
    step = m * t_mb + bubble + dp_c + optimizer
    main_seq = seq or view.component(view.main).seq_len
    tokens = plan.global_batch * main_seq
    flops = train_flops_per_sample(graph, seq) * plan.global_batch
    per_gpu = flops / step / plan.world_size
    comm = {"tp": m * tp_c, "cp": m * cp_c, "pp": m * pp_c, "dp": dp_c}
    return StepCost(step_s=step, compute_s=m * (fwd + bwd), recompute_s=m * rc, exposed_comm_s=sum(comm.values()),
                    bubble_s=bubble, optimizer_s=optimizer, comm=comm,
                    tokens_per_s_per_gpu=tokens / step / plan.world_size, tflops_per_gpu=per_gpu / 1e12,
                    mfu=per_gpu / (cluster.gpu.bf16_tflops * 1e12), memory=memory, host_s=m * host,
                    launch_host_s=m * launch_host, launches=m * n_launch)


def _dp_exposed(plan, elems: int, db: int, compute_mb: float, bwd_mb: float, m: int, nblocks: int, coll) -> float:
    """Exposed data-parallel communication per step (see the module docstring)."""
    ranks = plan.dp * plan.cp
    if ranks <= 1:
        return 0.0
    if plan.zero_stage < 2:
        reduce = coll("all_reduce", 4 * elems, plan.dp, "dp_replicate") if plan.cp == 1 else \
            coll("all_reduce", 4 * elems, ranks, "cp")
        exposed = max(0.0, reduce - _OVERLAP * bwd_mb) + reduce / nblocks
        if plan.zero_stage == 1:
            exposed += coll("all_gather", 4 * elems, ranks, "cp" if plan.cp > 1 else "dp_replicate")
        return exposed
    shard = plan.dp_shard * plan.cp
    dim = "cp" if plan.cp > 1 else "dp_shard"
    gathers = 2 if plan.zero_stage == 3 else 1
    per_mb = gathers * coll("all_gather", db * elems, shard, dim) + coll("reduce_scatter", 4 * elems, shard, dim)
    exposed = m * (max(0.0, per_mb - _OVERLAP * compute_mb) + per_mb / nblocks)
    replicas = plan.dp // max(plan.dp_shard, 1)
    if replicas > 1:
        exposed += coll("all_reduce", 4 * elems / shard, replicas, "dp_replicate")
    return exposed
