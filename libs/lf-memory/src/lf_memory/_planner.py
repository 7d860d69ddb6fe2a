"""The recompute planner: per block, what to recompute with the least recomputed FLOPs under a budget.

A multiple-choice knapsack over the blocks of an lf-ir graph: every node whose
class sets ``is_block`` (transformer, Qwen2-VL ``MMBlock``, Wan ``DiTBlock``, the
pi0 ``JointAttentionBlock``). Each block takes one of
:data:`lf_memory.BLOCK_OPTIONS` its type has a rule for
(:func:`lf_memory._saved_bytes.block_options`; ``"none"`` and ``"full"`` always); each option has a cost
(bytes kept for backward, :func:`lf_memory.block_saved_bytes`) and a price
(FLOPs recomputed in backward):

- ``"none"``: 0 FLOPs;
- ``"selective"``: the ops it re-runs are norms, activations, RoPE and masks,
  which the IR's FLOP model counts as 0; the planner prices them at **one FLOP
  per element they rebuild** (the bytes the option frees over ``"none"``
  divided by ``dtype_bytes``), so it never picks them for free;
- ``"selective_attn"``: the above plus the attention cores (the score and value
  products, :attr:`lf_memory._block_rules.BlockProfile.attention_flops`: the dense
  ``4 * batch * seq^2 * dim`` term of the MFU convention for a transformer block);
- ``"full"``: the block's whole ``forward_flops``.

Bytes follow a kernel path, ``kernels`` as in :func:`lf_memory.estimate_memory`: ``"cuda"`` (the
default: the planner plans GPU runs) counts every RMSNorm as ``aten::_fused_rms_norm`` keeps it (its input
and a float32 rstd; a decoder's norms read the ``stream_db`` residual stream, float32 under autocast over
float32 weights), ``"cpu"`` the IR's CPU rules (a CPU run). Only the ``"none"`` option and the non-block
nodes depend on it, so the planner and :func:`lf_memory.estimate_memory` on the same path count the same
bytes for a block kept whole; before lf-memory 0.4.4 the planner always used the CPU rules, which
over-count a DiT block by its float32 norm copies, and recomputed Wan blocks that fit on the GPU.

Everything that is not a block (embeddings, patch embeddings, heads, mergers)
keeps its IR ``saved_bytes`` (on the ``kernels`` path) whatever the plan; nodes without a byte rule are
counted as 0 and listed in :attr:`RecomputePlan.unpredicted`. Tensors every block
of a component shares (a DiT's text context, RoPE tables and time embedding, a
joint block's key padding) are counted once per component, as if some block were
checkpointed (an overcount of a few bytes per token when none is).

Solver: exact. Blocks are merged one at a time into a Pareto frontier of
(bytes, FLOPs) partial plans (dominated points and points already over the
budget are dropped), which is the classic dynamic program for the
multiple-choice knapsack (Kellerer, Pferschy & Pisinger, "Knapsack Problems",
2004, ch. 11) without a byte grid, so no rounding. Identical blocks (the usual
case) keep the frontier small: ``O(L^(k-1))`` points for ``L`` equal blocks and
``k`` options at worst, a few thousand for 80 blocks in practice. Compared
with a global switch (Megatron-LM's full / selective, Korthikanti et al. 2022,
arXiv 2205.05198) it can mix options across blocks and components.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import msgspec

from lf_ir import Graph

from ._block_rules import block_profile
from ._saved_bytes import (
    BLOCK_OPTIONS,
    SHARED_TERMS,
    block_options,
    block_saved_terms,
    check_kernels,
    is_block,
    node_saved_bytes,
    stack_shared_bytes,
)

__all__ = ["RecomputePlan", "block_option_costs", "plan_recompute", "solve_recompute"]


class RecomputePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`plan_recompute` chose: one option per block, and its totals."""

    options: dict[str, list[str]]
    """Component name -> one of :data:`lf_memory.BLOCK_OPTIONS` per block of that component, in order."""
    names: dict[str, list[str]]
    """Component name -> the IR node names of its blocks (to check against lowered modules)."""
    budget_bytes: int
    """The budget the plan was made for (activation bytes kept for backward)."""
    saved_bytes: int
    """Predicted bytes kept for backward under the plan (all nodes, times ``in_flight``)."""
    recompute_flops: int
    """FLOPs recomputed in backward per micro-batch (the planner's price; see the module docstring)."""
    fits: bool
    """Whether ``saved_bytes <= budget_bytes``. When False the plan is all ``"full"`` (the least memory)."""
    unpredicted: list[str] = []
    """``component.node`` names without a ``saved_bytes`` rule, counted as 0 bytes."""

    def block_options(self) -> list[str]:
        """One option per block over all components, in graph order (``model.blocks`` order)."""
        return [option for opts in self.options.values() for option in opts]

    def block_names(self) -> list[str]:
        """The IR node names matching :meth:`block_options`."""
        return [name for names in self.names.values() for name in names]

    def counts(self) -> dict[str, int]:
        """How many blocks take each option."""
        flat = self.block_options()
        return {option: flat.count(option) for option in BLOCK_OPTIONS}


def _option_costs(node, batch: int, seq: int, dtype_bytes: int, key_padding: bool, shared: bool,
                  kernels: str = "cuda", stream_db: int | None = None) -> dict[str, tuple[int, int]]:
    terms = {o: block_saved_terms(node, batch, seq, o, key_padding=key_padding, dtype_bytes=dtype_bytes,
                                  kernels=kernels, stream_db=stream_db)
             for o in block_options(node)}
    saved = {o: sum(v for k, v in t.items() if shared or k not in SHARED_TERMS) for o, t in terms.items()}
    costs = {"none": (saved["none"], 0), "full": (saved["full"], node.forward_flops(batch, seq))}
    if "selective" in saved:
        elementwise = max(0, saved["none"] - saved["selective"]) // dtype_bytes
        core = block_profile(node, batch, seq, dtype_bytes).attention_flops
        costs["selective"] = (saved["selective"], elementwise)
        costs["selective_attn"] = (saved["selective_attn"], elementwise + core)
    return costs


def block_option_costs(
    node, batch: int, seq: int, dtype_bytes: int = 2, *, key_padding: bool = False, kernels: str = "cuda",
    stream_db: int | None = None,
) -> dict[str, tuple[int, int]]:
    """Option -> (bytes kept for backward, FLOPs recomputed) for one block alone (module docstring's prices).

    ``node`` is any lf-ir block; the options are those of :func:`lf_memory._saved_bytes.block_options`.
    ``kernels`` / ``stream_db``: as :func:`plan_recompute` (default ``"cuda"``).

    Raises:
        TypeError / ValueError: as :func:`lf_memory.block_saved_bytes`.
    """
    return _option_costs(node, batch, seq, dtype_bytes, key_padding, True, kernels, stream_db)


def solve_recompute(
    items: Sequence[Mapping[str, tuple[int, int]]], budget: int,
) -> tuple[list[str], int, int] | None:
    """Exact multiple-choice knapsack: one option per item, total bytes <= ``budget``, least total FLOPs.

    Args:
        items: per item, option -> (bytes, flops), both non-negative ints.
        budget: the byte limit.

    Returns:
        ``(options, bytes, flops)`` of an optimal choice (ties: fewer bytes), or None when even the
        least-bytes option of every item exceeds the budget.
    """
    # frontier: bytes -> (flops, chain); chain is a linked list (option, parent) to rebuild the choice
    frontier: list[tuple[int, int, tuple | None]] = [(0, 0, None)]
    for item in items:
        candidates = sorted(
            ((b + ib, f + iflops, (option, chain))
             for b, f, chain in frontier for option, (ib, iflops) in item.items() if b + ib <= budget),
            key=lambda point: (point[0], point[1]))
        frontier = []
        best = None
        for b, f, chain in candidates:  # ascending bytes: keep a point only if it lowers the FLOPs
            if best is None or f < best:
                frontier.append((b, f, chain))
                best = f
        if not frontier:
            return None
    b, f, chain = min(frontier, key=lambda p: (p[1], p[0]))
    options: list[str] = []
    while chain is not None:
        option, chain = chain
        options.append(option)
    return options[::-1], b, f


def _component_seq(comp, seq: int | Mapping[str, int] | None) -> int:
    if seq is None:
        return comp.seq_len
    if isinstance(seq, Mapping):
        return seq.get(comp.name, comp.seq_len)
    return seq


def plan_recompute(
    graph: Graph, budget_bytes: int, batch: int, seq: int | Mapping[str, int] | None = None,
    dtype_bytes: int = 2, *, key_padding: bool | Collection[str] = False, in_flight: int = 1,
    options: Sequence[str] = BLOCK_OPTIONS, kernels: str = "cuda", stream_db: int | None = None,
) -> RecomputePlan:
    """Choose per block what to recompute so activations fit ``budget_bytes`` with the least recomputed FLOPs.

    Args:
        graph: an lf-ir graph; its blocks (nodes whose class sets ``is_block``) are planned.
        budget_bytes: bytes available per GPU for activations kept for backward (what remains after
            parameters, gradients, optimizer state and buffers: the memory estimator's job).
        batch: micro-batch size (samples) on this rank.
        seq: tokens per sample on this rank: None for each component's ``seq_len``, an int for every
            component, or ``{component: tokens}`` (others keep ``seq_len``). Divide by the CP degree.
        dtype_bytes: bytes per activation element (2 for bf16 / fp16, 4 for float32).
        key_padding: whether a transformer block's attention gets a (batch, seq) key-padding mask (VLA
            instructions): a bool for every component, or the names of the components that get one
            (``{"backbone"}``). Joint blocks count their own key padding.
        in_flight: micro-batches whose activations are alive at once (1 without pipelining; up to the
            number of stages on the first stage under 1F1B). The bytes of one micro-batch are multiplied.
        options: the block options allowed, a subset of :data:`lf_memory.BLOCK_OPTIONS` with ``"full"``
            (e.g. ``("none", "full")`` for a per-block on/off plan).
        kernels: the kernel path the bytes follow, as :func:`lf_memory.estimate_memory`'s: ``"cuda"`` (the
            default; RMSNorms keep what ``aten::_fused_rms_norm`` saves, their input and a float32 rstd) or
            ``"cpu"`` (lf-ir's CPU rules exactly: a run on the CPU, what ``measure_saved_bytes`` sees there).
        stream_db: with ``kernels="cuda"``, bytes per element of the residual stream a decoder's norms (a
            transformer block's two, a standalone ``Norm``) read: None for float32
            (:data:`lf_memory._saved_bytes.STREAM_BYTES`, autocast over float32 weights), ``dtype_bytes``
            when FSDP2 casts the parameters (ZeRO-2/3 with a bf16 / fp16 plan, as ``estimate_memory`` counts
            it). The DiT's q/k norms read the projections' ``dtype_bytes`` outputs whatever it is.

    Returns:
        A :class:`RecomputePlan`; ``fits`` False (and every block ``"full"``) when nothing fits.

    Raises:
        ValueError: a non-positive size, ``budget_bytes < 0``, ``options`` without ``"full"`` or with
            an unknown option, or ``kernels`` not ``"cpu"`` / ``"cuda"``.

    Example:
        >>> from lf_ir import llama3_config
        >>> from lf_ir.recipes.llama3 import build_graph
        >>> graph = build_graph(llama3_config("tiny"), seq_len=24)
        >>> plan = plan_recompute(graph, 500_000, batch=2, dtype_bytes=4, kernels="cpu")
        >>> plan.fits, plan.block_options()
        (True, ['selective', 'none'])
    """
    for name, value in (("batch", batch), ("dtype_bytes", dtype_bytes), ("in_flight", in_flight)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    check_kernels(kernels)
    if stream_db is not None and (isinstance(stream_db, bool) or not isinstance(stream_db, int) or stream_db < 1):
        raise ValueError(f"stream_db must be None or an int >= 1, got {stream_db!r}")
    unknown = [o for o in options if o not in BLOCK_OPTIONS]
    if unknown or "full" not in options:
        raise ValueError(f"options must be a subset of {list(BLOCK_OPTIONS)} containing 'full', got {list(options)}")
    fixed, unpredicted = 0, []
    items: list[dict[str, tuple[int, int]]] = []
    names: dict[str, list[str]] = {}
    for comp in graph.components:
        s = _component_seq(comp, seq)
        if s < 1:
            raise ValueError(f"seq for component {comp.name!r} must be >= 1, got {s}")
        padded = key_padding if isinstance(key_padding, bool) else comp.name in key_padding
        blocks = comp.blocks()
        if blocks:  # tensors all blocks share: once per component, under the most demanding option
            first = blocks[0]
            shared = max(sum(v for k, v in block_saved_terms(first, batch, s, o, key_padding=padded,
                                                              dtype_bytes=dtype_bytes, kernels=kernels,
                                                              stream_db=stream_db).items() if k in SHARED_TERMS)
                         for o in block_options(first) if o in options)
            fixed += (shared + stack_shared_bytes(first, batch, s, dtype_bytes)) * in_flight
        for node in comp.nodes:
            if is_block(node):
                costs = _option_costs(node, batch, s, dtype_bytes, padded, False, kernels, stream_db)
                items.append({o: (b * in_flight, f) for o, (b, f) in costs.items() if o in options})
                names.setdefault(comp.name, []).append(node.name)
            elif hasattr(node, "saved_bytes"):
                fixed += node_saved_bytes(node, batch, s, dtype_bytes, kernels, stream_db) * in_flight
            else:
                unpredicted.append(f"{comp.name}.{node.name}")
    solved = solve_recompute(items, budget_bytes - fixed) if budget_bytes >= fixed else None
    fits = solved is not None
    if solved is None:
        chosen = ["full"] * len(items)
        solved = (chosen, sum(i["full"][0] for i in items), sum(i["full"][1] for i in items))
    chosen, block_bytes, flops = solved
    per_comp: dict[str, list[str]] = {}
    position = 0
    for comp, comp_names in names.items():
        per_comp[comp] = chosen[position:position + len(comp_names)]
        position += len(comp_names)
    return RecomputePlan(options=per_comp, names=names, budget_bytes=budget_bytes, saved_bytes=fixed + block_bytes,
                         recompute_flops=flops, fits=fits, unpredicted=unpredicted)
