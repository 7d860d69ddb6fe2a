"""Per-rank memory estimate against real tensors and the IR's saved-activation totals.

Oracles: the bytes of the parameters, gradients and AdamW state of a real tiny
Llama 3 after one step on the CPU (float32); the same tensors cut as tensor
parallelism (``torch.chunk`` along each parameter's ``tp_dims``) and FSDP2
(dim 0 padded to a multiple of the shard count, then chunked) cut them; and the
sum of ``saved_bytes`` over the graph's nodes (lf-ir's rules, checked against
autograd in lf-ir's own tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

from lf_ir import Llama3Model, llama3_config, materialize
from lf_ir.recipes import llama3, wan_dit
from lf_memory._estimate import estimate_memory, in_flight_micro_batches

SEQ = 16


@dataclass(frozen=True)
class FakePlan:
    """The fields of ``lf_parallel.Plan`` the estimator reads (lf-memory must not import lf-parallel)."""

    dp: int = 1
    tp: int = 1
    sp: bool = False
    pp: int = 1
    cp: int = 1
    zero_stage: int = 0
    dp_replicate: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    pp_schedule: str = "1f1b"
    pp_virtual_stages: int = 1
    cp_kind: str = "ring"
    precision: str = "fp32"
    components: dict = field(default_factory=dict)

    @property
    def dp_shard(self) -> int:
        return self.dp // self.dp_replicate if self.zero_stage >= 2 else 1

    def component_tp(self, name: str) -> int:
        return self.tp

    def component_sp(self, name: str) -> bool:
        return self.sp and self.tp > 1


def _trained_tiny():
    cfg = llama3_config("tiny")
    graph = llama3.build_graph(cfg, SEQ)
    with torch.device("meta"):
        model = Llama3Model(cfg, graph)
    model = materialize(model, "cpu", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (2, SEQ))
    model(ids).float().sum().backward()
    opt.step()
    return graph, model, opt


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_single_rank_matches_real_tensors():
    """Oracle: the real parameter, gradient and AdamW state tensors after one step."""
    graph, model, opt = _trained_tiny()
    est = estimate_memory(graph, precision="fp32", batch=2, seq=SEQ, kernels="cpu")
    params = list(model.parameters())
    assert est.params == _nbytes(params)
    assert est.grads == _nbytes(p.grad for p in params)
    state = [t for p in params for t in opt.state[p].values()]
    assert est.optimizer == _nbytes(state)
    assert est.compute_params == 0 and est.comm_buffers == 0


def _shard_bytes(model, graph, tp: int, shards: int) -> int:
    """Bytes of rank 0's pieces: tp chunk along each tp dim, then FSDP2's padded dim-0 chunk."""
    comp = graph.components[0]
    total = 0
    for node in comp.nodes:
        module = model.components["text"][node.name]
        named = dict(module.named_parameters())
        for key, dim in node.tp_dims().items():
            tensor = named[key].detach()
            if dim is not None:
                tensor = torch.chunk(tensor, tp, dim=dim)[0]
            if shards > 1:
                rows = math.ceil(tensor.shape[0] / shards) * shards
                padded = torch.zeros((rows, *tensor.shape[1:]))
                padded[: tensor.shape[0]] = tensor
                tensor = torch.chunk(padded, shards, dim=0)[0]
            total += tensor.numel() * tensor.element_size()
    return total


@pytest.mark.parametrize(("tp", "dp", "zero"), [(2, 1, 0), (1, 3, 3), (2, 2, 3), (2, 3, 2)])
def test_sharded_params_match_chunks(tp, dp, zero):
    """Oracle: the tiny model's tensors cut by torch.chunk as TP and FSDP2 (padded dim 0) cut them."""
    graph, model, _ = _trained_tiny()
    plan = FakePlan(dp=dp, tp=tp, sp=tp > 1, zero_stage=zero)
    est = estimate_memory(graph, plan, precision="fp32", seq=SEQ, kernels="cpu")
    shards = plan.dp_shard if zero >= 2 else 1
    expected = _shard_bytes(model, graph, tp, shards)
    assert est.params == expected and est.grads == expected
    tensors = sum(len(n.param_shapes()) for n in graph.components[0].nodes)
    assert est.optimizer == 2 * expected + 4 * tensors


def test_zero1_shards_only_optimizer_state():
    """Oracle: ZeRO-1 keeps whole parameters and gradients; AdamW state is split evenly over dp."""
    graph, model, _ = _trained_tiny()
    full = estimate_memory(graph, FakePlan(dp=4), precision="fp32", seq=SEQ, kernels="cpu")
    z1 = estimate_memory(graph, FakePlan(dp=4, zero_stage=1), precision="fp32", seq=SEQ, kernels="cpu")
    numel = sum(p.numel() for p in model.parameters())
    assert z1.params == full.params == 4 * numel
    assert z1.optimizer == math.ceil(numel / 4) * 8 + 4 * math.ceil(len(list(model.parameters())) / 4)
    assert full.comm_buffers == 4 * numel  # DDP's gradient buckets


@pytest.mark.parametrize("db,precision", [(4, "fp32"), (2, "bf16")])
def test_activations_equal_ir_totals(db, precision):
    """Oracle: the sum of every node's lf-ir ``saved_bytes`` (no recompute, one rank)."""
    graph = llama3.build_graph(llama3_config("tiny"), SEQ)
    nodes = graph.components[0].nodes
    est = estimate_memory(graph, precision=precision, batch=3, seq=SEQ, kernels="cpu")
    assert est.activations == sum(n.saved_bytes(3, SEQ, db) for n in nodes)
    full = estimate_memory(graph, precision=precision, batch=3, seq=SEQ, recompute="full", kernels="cpu")
    blocks = [n for n in nodes if type(n).__name__ == "TransformerBlock"]
    others = sum(n.saved_bytes(3, SEQ, db) for n in nodes if n not in blocks)
    assert full.activations == others + len(blocks) * 3 * SEQ * blocks[0].in_dim * db
    block_input = 3 * SEQ * blocks[0].in_dim * db
    assert full.temporaries - est.temporaries == blocks[0].saved_bytes(3, SEQ, db) - block_input


def test_tp_sp_cp_divide_activations():
    """Oracle: with sp, tp and cp every per-token term divides; without sp only the inner ones do."""
    graph = llama3.build_graph(llama3_config("tiny"), SEQ)
    base = estimate_memory(graph, precision="fp32", seq=SEQ, recompute="full", kernels="cpu").activations
    sp = estimate_memory(graph, FakePlan(tp=2, sp=True, dp=2, zero_stage=3), precision="fp32", seq=SEQ,
                         recompute="full", kernels="cpu").activations
    cp = estimate_memory(graph, FakePlan(cp=2, dp=1), precision="fp32", seq=SEQ, recompute="full",
                         kernels="cpu").activations
    assert sp == base // 2
    assert cp == base // 2
    none = estimate_memory(graph, precision="fp32", seq=SEQ, kernels="cpu").activations
    tp_only = estimate_memory(graph, FakePlan(tp=2, dp=1), precision="fp32", seq=SEQ, kernels="cpu").activations
    assert none / 2 < tp_only < none


def test_pipeline_in_flight_micro_batches():
    """Oracle: 1F1B's stage s holds min(pp - s, m) micro-batches, GPipe all m, interleaved p + (p-1)/v on stage 0."""
    assert in_flight_micro_batches("1f1b", 4, 0, 8) == 4
    assert in_flight_micro_batches("1f1b", 4, 3, 8) == 1
    assert in_flight_micro_batches("gpipe", 4, 0, 8) == 8
    assert in_flight_micro_batches("interleaved_1f1b", 4, 0, 16, 2) == 4 + 3 / 2
    graph = llama3.build_graph(llama3_config("tiny", layers=4), SEQ)
    one = estimate_memory(graph, precision="fp32", seq=SEQ, recompute="full", kernels="cpu")
    staged = estimate_memory(graph, FakePlan(pp=2, grad_accum=4), precision="fp32", seq=SEQ,
                             recompute="full", stage=0, kernels="cpu")
    block_input = SEQ * 64 * 4
    assert staged.activations == 2 * (SEQ * 8 + 2 * block_input)
    others = sum(n.saved_bytes(1, SEQ, 4) for n in graph.components[0].nodes if "layer" not in n.name)
    assert one.activations == others + 4 * block_input


def test_cuda_kernels_count_fused_rms_norm():
    """Oracle: the documented difference between the CPU and CUDA RMSNorm rules, written out per norm (bf16,
    batch 2): CPU keeps a float32 input, ``x * rstd`` and rstd (``(2Td + T) * 4``); CUDA's fused kernel the input
    and a float32 rstd (``T * d * in + T * 4``). A decoder's norms read the float32 residual stream (in = 4: autocast
    over float32 weights) unless FSDP2 casts the parameters (ZeRO-3, plan precision bf16: in = 2); the DiT's
    q/k norms read bf16 projections (in = 2)."""
    def cpu_minus_cuda(tokens, dim, input_bytes):
        return (2 * tokens * dim + tokens) * 4 - (tokens * dim * input_bytes + tokens * 4)

    graph = llama3.build_graph(llama3_config("tiny"), SEQ)
    nodes = graph.components[0].nodes
    norms = 2 * sum(type(n).__name__ == "TransformerBlock" for n in nodes) + 1  # two per block, the final one
    dim, tokens = nodes[0].out_dim, 2 * SEQ
    for plan, input_bytes in ((None, 4), (FakePlan(dp=2, zero_stage=3, precision="bf16"), 2)):
        cpu = estimate_memory(graph, plan, precision="bf16", batch=2, seq=SEQ, kernels="cpu").activations
        cuda = estimate_memory(graph, plan, precision="bf16", batch=2, seq=SEQ, kernels="cuda").activations
        assert cpu - cuda == norms * cpu_minus_cuda(tokens, dim, input_bytes)

    cfg = wan_dit.wan_dit_config("tiny")
    dit = wan_dit.build_graph(cfg)
    seq = dit.component("video").seq_len
    blocks = cfg.layers
    per_block = 3 * cpu_minus_cuda(2 * seq, cfg.dim, 2) + cpu_minus_cuda(2 * cfg.text_len, cfg.dim, 2)  # q, k; q; k
    cpu = estimate_memory(dit, precision="bf16", batch=2, kernels="cpu")
    cuda = estimate_memory(dit, precision="bf16", batch=2, kernels="cuda")
    assert cpu.activations - cuda.activations == blocks * per_block
    assert estimate_memory(dit, precision="bf16", batch=2) == cuda  # planning defaults to CUDA
    with pytest.raises(ValueError, match="kernels"):
        estimate_memory(dit, kernels="tpu")


def test_dit_graph_and_errors():
    """Oracle: the DiT estimate is positive, full recompute keeps one width-d tensor per block; bad names raise."""
    cfg = wan_dit.wan_dit_config("tiny")
    graph = wan_dit.build_graph(cfg)
    none = estimate_memory(graph, recompute="none")
    full = estimate_memory(graph, recompute="full")
    assert none.activations > full.activations > 0
    with pytest.raises(ValueError, match="precision"):
        estimate_memory(graph, precision="int8")
    with pytest.raises(ValueError, match="memory.recompute"):
        estimate_memory(graph, recompute="some")
    with pytest.raises(ValueError, match="stage"):
        estimate_memory(graph, stage=2)


def test_ring_context_parallel_counts_masked_block_scores():
    """Oracle: the documented rule: a ring plan adds one masked block's explicit-softmax scores,
    micro x heads / tp x (seq / cp)^2 x RING_SCORE_BYTES, to the temporaries; Ulysses and full masks add none."""
    from lf_memory._estimate_rules import RING_SCORE_BYTES

    cfg = llama3_config("tiny")
    seq, micro = 64, 2
    graph = llama3.build_graph(cfg, seq)
    ring = estimate_memory(graph, FakePlan(cp=2, micro_batch=micro), seq=seq)
    uly = estimate_memory(graph, FakePlan(cp=2, cp_kind="ulysses", micro_batch=micro), seq=seq)
    assert ring.temporaries - uly.temporaries == micro * cfg.heads * (seq // 2) ** 2 * RING_SCORE_BYTES
    assert ring.activations == uly.activations
    dit = wan_dit.build_graph(wan_dit.wan_dit_config("tiny"))  # full-mask self-attention: kernel-pair blocks
    assert (estimate_memory(dit, FakePlan(cp=2)).temporaries
            == estimate_memory(dit, FakePlan(cp=2, cp_kind="ulysses")).temporaries)

