"""Saved-bytes rules of the Qwen2-VL, Wan DiT and Wan VAE node families, per node and per recipe.

Oracle: ``torch.autograd.graph.saved_tensors_hooks`` on the lowered modules (every saved tensor deduplicated
by storage, parameters and the caller's shared tensors excluded; ``tests/test_ir_bytes.py`` for the base
nodes), float32 and bfloat16 modules on the CPU kernels of torch 2.13. The rules are exact there: the tests
assert equality to the byte.
"""

from __future__ import annotations

import msgspec
import pytest
import torch
from _saved_bytes import measure_saved

from lf_ir import _lower_mm, _lower_vae, _lower_video, flow  # noqa: F401  (register the lowerings)
from lf_ir._lower import lower_node, materialize
from lf_ir._mrope import MRoPE, VisionRoPE
from lf_ir._mrope_torch import mrope_cos_sin, vision_rope_cos_sin
from lf_ir._nodes import Embedding, Norm, TransformerBlock
from lf_ir._nodes_dit import DiTAttention, DiTBlock
from lf_ir._nodes_flow import FlowMatchingLoss
from lf_ir._nodes_mm import MMAttention, MMBlock
from lf_ir._nodes_vae import CausalConv3D, ChannelRMSNorm, VAEAttention, VAEResample, VAEResBlock
from lf_ir._nodes_vision import FeedForward, PatchEmbed3D, PatchMerger
from lf_ir._rope3d_torch import rope3d_cos_sin
from lf_ir.recipes import llama3, qwen2_vl, vla, wan_dit, wan_vae

DTYPES = [(torch.float32, 4), (torch.bfloat16, 2)]
B, S, D = 2, 12, 16


def _lowered(node, dtype):
    with torch.device("meta"):
        module = lower_node(node)
    return materialize(module, "cpu", 0).to(dtype)


def _x(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


# ---------------------------------------------------------------- vision / multimodal nodes

FFN = [FeedForward(name=f"ffn_{a}", dim=D, hidden=40, activation=a) for a in ("gelu", "gelu_tanh", "quick_gelu",
                                                                               "silu")]


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
def test_vision_nodes_saved_bytes_exact(dtype, nbytes):
    """Oracle: saved_tensors_hooks on FeedForward (every activation), PatchMerger and PatchEmbed3D."""
    for node in FFN:
        module = _lowered(node, dtype)
        x = _x(B, S, D, dtype=dtype)
        assert measure_saved(lambda m=module, x=x: m(x), module) == node.saved_bytes(B, S, nbytes), node.name
    merger = PatchMerger(name="merger", in_features=D, out_features=24)
    module = _lowered(merger, dtype)
    x = _x(B * S, D, dtype=dtype)
    assert measure_saved(lambda: module(x), module) == merger.saved_bytes(B, S, nbytes)
    patch = PatchEmbed3D(name="patch", dim=D, patch_size=2)
    module = _lowered(patch, dtype)
    pixels = torch.randn(B * S, patch.patch_features)  # float32 pixels cast to the weights' dtype, as Qwen2-VL
    assert measure_saved(lambda: module(pixels), module) == patch.saved_bytes(B, S, nbytes)


MM = [
    MMAttention(name="text_mrope", dim=D, heads=4, kv_heads=2, mask="causal", rope=MRoPE(sections=(1, 1, 0))),
    MMAttention(name="vision_rope", dim=D, heads=2, kv_heads=2, mask="full", o_bias=True, rope=VisionRoPE()),
]


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("key_padding", [False, True], ids=["nopad", "pad"])
def test_mm_attention_saved_bytes_exact(key_padding, dtype, nbytes):
    """Oracle: saved_tensors_hooks through lf_kernels' CPU flash and dense-mask paths; the rotary tables are
    the caller's (excluded, :meth:`MMAttention.rope_table_bytes` checked apart); the vision node is called
    with segments (one and two), the M-RoPE node also computing its own tables."""
    text, vision = MM
    module = _lowered(text, dtype)
    x = _x(B, S, D, dtype=dtype)
    pad = torch.ones(B, S, dtype=torch.bool) if key_padding else None
    if pad is not None:
        pad[0, -3:] = False
    tables = mrope_cos_sin(text.rope, text.head_dim, torch.arange(S).expand(3, B, S), dtype)
    assert sum(t.untyped_storage().nbytes() for t in tables) == text.rope_table_bytes(B, S, nbytes)
    measured = measure_saved(lambda: module(x, None, pad, cos_sin=tables), module, tables)
    assert measured == text.saved_bytes(B, S, nbytes, key_padding=key_padding)
    measured = measure_saved(lambda: module(x, None, pad), module)
    assert measured == text.saved_bytes(B, S, nbytes, key_padding=key_padding, own_tables=True)
    if key_padding:
        return
    module = _lowered(vision, dtype)
    cos, sin = vision_rope_cos_sin(vision.rope, vision.head_dim, torch.stack([torch.arange(B * S) // 4,
                                                                               torch.arange(B * S) % 4], 1))
    assert cos.nbytes + sin.nbytes == vision.rope_table_bytes(B, S, nbytes)
    cs = (cos.view(B, S, -1), sin.view(B, S, -1))
    for segments in ([S], [4, 8]):
        measured = measure_saved(lambda s=segments: module(x, cos_sin=cs, segments=s), module, (cos, sin))
        assert measured == vision.saved_bytes(B, S, nbytes), segments
    measured = measure_saved(lambda: module(x, cos_sin=cs), module, (cos, sin))
    assert measured == vision.saved_bytes(B, S, nbytes, segmented=False)


# ---------------------------------------------------------------- Wan DiT nodes

def _dit_parts():
    cfg = wan_dit.wan_dit_config("tiny")
    graph = wan_dit.build_graph(cfg)
    return cfg, graph, {n.name: n for n in graph.component("video").nodes}


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
def test_dit_nodes_saved_bytes_exact(dtype, nbytes):
    """Oracle: saved_tensors_hooks on each lowered Wan DiT node of the tiny recipe (45 tokens on a 3x3x5 grid,
    7 text tokens); the RoPE tables and the text context are the caller's (excluded here, and equal to
    ``shared_saved_bytes``)."""
    cfg, graph, nodes = _dit_parts()
    grid, seq, d = (3, 3, 5), 45, cfg.dim
    rope = rope3d_cos_sin(cfg.rope(), cfg.head_dim, grid)
    ctx = _x(B, cfg.text_len, d, dtype=dtype)
    x, emb = _x(B, seq, d, dtype=dtype), _x(B, 6, d, dtype=dtype)
    block = nodes["block0"]
    assert isinstance(block, DiTBlock)
    shared = block.shared_saved_bytes(B, seq, nbytes)
    assert shared == sum(t.untyped_storage().nbytes() for t in (*rope, ctx))
    for node, call in ((block.self_attn, lambda m: m(x, rope=rope)), (block.cross_attn, lambda m: m(x, context=ctx)),
                       (block, lambda m: m(x, ctx, emb, rope)), (block.ffn, lambda m: m(x))):
        module = _lowered(node, dtype)
        measured = measure_saved(lambda m=module, c=call: c(m), module, (*rope, ctx))
        assert measured == node.saved_bytes(B, seq, nbytes), node.name
    cases = [(nodes["patch_embed"], lambda: (torch.randn(B, cfg.in_channels, 3, 6, 10, dtype=dtype),)),
             (nodes["time_embed"], lambda: (torch.tensor([3.0, 500.0]),)),
             (nodes["head"], lambda: (x, _x(B, d, dtype=dtype))),
             (graph.component("text").nodes[0], lambda: (torch.randn(B, cfg.text_len, cfg.text_dim, dtype=dtype),))]
    for node, args in cases:
        module = _lowered(node, dtype)
        inputs = args()
        tokens = cfg.text_len if node.name == "text_proj" else seq
        assert measure_saved(lambda m=module, a=inputs: m(*a), module) == node.saved_bytes(B, tokens, nbytes)
    assert block.modulation.saved_bytes(B, seq, nbytes) == 0  # kept by the block's gates, counted there


@pytest.mark.parametrize("weighting", ["none", "cosmap"])
def test_flow_loss_saved_bytes_exact(weighting):
    """Oracle: saved_tensors_hooks on the lowered FlowMatchingLoss (float32 error; per-sample weights)."""
    node = FlowMatchingLoss(name="loss", dim=8, weighting=weighting)
    for dtype, nbytes in DTYPES:
        module = _lowered(node, dtype)
        pred, x0 = _x(B, 8, 3, 4, dtype=dtype), torch.randn(B, 8, 3, 4, dtype=dtype)
        measured = measure_saved(lambda m=module, p=pred, x=x0: m(p, x, torch.randn_like(x), torch.tensor([.3, .6])),
                                 module)
        assert measured == node.saved_bytes(B, 12, nbytes)


# ---------------------------------------------------------------- Wan VAE nodes

def _vae_nodes(frames: int) -> list:
    return [CausalConv3D(name="conv", in_channels=4, out_channels=6, frames=frames),
            CausalConv3D(name="conv_1x1", in_channels=4, out_channels=6, kernel=(1, 1, 1)),
            ChannelRMSNorm(name="norm", dim=4),
            VAEResBlock(name="res", in_channels=4, out_channels=6, frames=frames),
            VAEResBlock(name="res_same", in_channels=4, out_channels=4, frames=frames),
            VAEAttention(name="attn", dim=4, frames=frames),
            *(VAEResample(name=m, dim=4, mode=m, frames=frames) for m in ("down2d", "down3d", "up2d", "up3d"))]


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 4), (1, 5, 6, 6), (1, 1, 4, 4)], ids=str)
def test_vae_nodes_saved_bytes_exact(shape, dtype, nbytes):
    """Oracle: saved_tensors_hooks on each lowered VAE node (``seq`` = input voxels); batch 1 takes SDPA's math
    path in the attention block, a single frame skips the time convs."""
    batch, frames, height, width = shape
    for node in _vae_nodes(frames):
        module = _lowered(node, dtype)
        x = _x(batch, 4, frames, height, width, dtype=dtype)
        measured = measure_saved(lambda m=module, x=x: m(x), module)
        assert measured == node.saved_bytes(batch, frames * height * width, nbytes), node.name


def test_vae_conv_without_frames_leaves_padding_out():
    """Oracle: the stream formula by hand; ``frames`` 0 (unknown) counts the input alone, bad frames fail."""
    conv = CausalConv3D(name="c", in_channels=4, out_channels=6)
    assert conv.saved_bytes(2, 48, 4) == 2 * 48 * 4 * 4
    assert CausalConv3D(name="c", in_channels=4, out_channels=6, frames=3).saved_bytes(2, 48, 4) == 2 * 80 * 4 * 4
    with pytest.raises(Exception, match=r"node 'c' \(CausalConv3D\): frames must be a non-negative integer"):
        CausalConv3D(name="c", in_channels=4, out_channels=6, frames=-1)


# ---------------------------------------------------------------- whole recipes

def _model(cls, cfg, graph, dtype):
    with torch.device("meta"):
        model = cls(cfg, graph)
    return materialize(model, "cpu", 0).to(dtype)


def _nodes_saved(comp, batch: int, seq: int, nbytes: int, **kw) -> int:
    return sum(n.saved_bytes(batch, seq, nbytes, **(kw if isinstance(n, TransformerBlock) else {}))
               for n in comp.nodes)


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
def test_llama3_and_vla_trunk_saved_bytes_equal_node_sum(dtype, nbytes):
    """Oracle: saved_tensors_hooks on the whole lowered tiny llama3 (ids -> logits) and vla (teacher-forced
    logits, its backbone with key padding), against the sum of the node rules over every component."""
    cfg = llama3.llama3_config("tiny")
    graph = llama3.build_graph(cfg, seq_len=S)
    model = _model(llama3.Llama3Model, cfg, graph, dtype)
    ids = torch.randint(0, cfg.vocab_size, (B, S))
    assert measure_saved(lambda: model(ids), model) == _nodes_saved(graph.components[0], B, S, nbytes)
    cfg = vla.vla_config("tiny")
    graph = vla.build_graph(cfg)
    model = _model(vla.VLAModel, cfg, graph, dtype)
    image = torch.randint(0, 255, (B, cfg.image_size, cfg.image_size, 3), dtype=torch.uint8)
    instr = torch.randint(0, 50, (B, cfg.max_instruction_len))
    actions = torch.randint(0, 50, (B, cfg.num_action_tokens - 1))
    measured = measure_saved(lambda: model(image, instr, torch.ones_like(instr, dtype=torch.bool),
                                           torch.randn(B, cfg.state_dim, dtype=dtype), actions), model)
    predicted = sum(_nodes_saved(c, B, c.seq_len, nbytes, key_padding=c.name == "backbone")
                    for c in graph.components)
    assert measured == predicted


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
def test_qwen2_vl_trunk_saved_bytes_equal_node_sum(dtype, nbytes):
    """Oracle: saved_tensors_hooks on the whole lowered tiny Qwen2-VL (one 4x8-patch image in each of two
    sequences of 24 tokens) against the node rules (vision at batch 1 of 64 patches, text at batch 2) plus
    what the model shares across blocks: the vision and M-RoPE tables (``rope_table_bytes``, once each) and
    the bool placeholder mask ``masked_scatter`` keeps (batch*seq bytes)."""
    cfg = qwen2_vl.qwen2_vl_config("tiny")
    patches, seq = 2 * 32, 24  # two images of 1 x 4 x 8 patches, 8 merged tokens each
    graph = qwen2_vl.build_graph(cfg, seq_len=seq, image_patches=patches)
    model = _model(qwen2_vl.Qwen2VLModel, cfg, graph, dtype)
    ids = torch.randint(0, 400, (B, seq))
    ids[:, 2:10] = cfg.image_token_id
    grid = torch.tensor([[1, 4, 8], [1, 4, 8]])
    pixels = torch.randn(patches, 3 * 2 * 14 * 14)
    measured = measure_saved(lambda: model(ids, pixels, grid), model)
    vision, text = graph.component("vision"), graph.component("text")
    # the vision tower runs all images as one sequence of 64 patches, split in per-frame segments
    predicted = _nodes_saved(vision, 1, patches, nbytes) + _nodes_saved(text, B, seq, nbytes)
    predicted += vision.blocks()[0].attention.rope_table_bytes(1, patches, nbytes)
    predicted += text.blocks()[0].attention.rope_table_bytes(B, seq, nbytes) + B * seq
    assert measured == predicted


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
def test_wan_dit_trunk_saved_bytes_equal_node_sum(dtype, nbytes):
    """Oracle: saved_tensors_hooks on the tiny Wan DiT's flow-matching loss (text projection, patch embed, time
    embedding, blocks, head, loss; 45 tokens, 7 text tokens) against the node rules plus the shared context
    and RoPE tables, counted once (``DiTBlock.shared_saved_bytes``)."""
    cfg = wan_dit.wan_dit_config("tiny")
    graph = wan_dit.build_graph(cfg)
    model = _model(wan_dit.WanDiTModel, cfg, graph, dtype)
    x0 = torch.randn(B, cfg.in_channels, 3, 6, 10, dtype=dtype)
    text = torch.randn(B, cfg.text_len, cfg.text_dim, dtype=dtype)
    measured = measure_saved(lambda: model.flow_loss(x0, text, torch.randn_like(x0), torch.tensor([.2, .7])), model)
    video = graph.component("video")
    predicted = sum(_nodes_saved(c, B, c.seq_len, nbytes) for c in graph.components)
    predicted += video.blocks()[0].shared_saved_bytes(B, video.seq_len, nbytes)
    assert video.seq_len == 45 and len(video.blocks()) == cfg.layers
    assert measured == predicted


def _with_frames(graph):
    """The graph with ``frames`` set on every conv and residual block (from each level's resample / attention
    nodes, the last decoder level from the upsampler before it)."""
    comps, frames = [], 0
    for comp in graph.components:
        known = [n.frames for n in comp.nodes if isinstance(n, (VAEResample, VAEAttention))]
        frames = known[0] if known else frames
        nodes = [msgspec.structs.replace(n, frames=frames) if isinstance(n, (CausalConv3D, VAEResBlock)) else n
                 for n in comp.nodes]
        comps.append(msgspec.structs.replace(comp, nodes=nodes))
        last = comp.nodes[-1]
        frames = last.out_frames if isinstance(last, VAEResample) else frames
    return msgspec.structs.replace(graph, components=comps)


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
def test_wan_vae_trunk_saved_bytes_equal_node_sum(dtype, nbytes):
    """Oracle: saved_tensors_hooks on the tiny Wan VAE's encoder stages on a 5 x 16 x 16 clip and decoder
    stages on its 2 x 2 x 2 latent (``mode="full"``, batch 2), against the node rules (``frames`` filled in
    from the clip) plus the SiLU input each stage keeps after a bare ``norm_out`` (batch*seq*channels)."""
    cfg = wan_vae.wan_vae_config("tiny")
    graph = _with_frames(wan_vae.build_graph(cfg, 5, 16, 16))
    model = _model(wan_vae.WanVAE, cfg, graph, dtype)
    video = torch.randn(B, 3, 5, 16, 16, dtype=dtype, requires_grad=True)
    latent = torch.randn(B, cfg.z_dim, 2, 2, 2, dtype=dtype, requires_grad=True)
    measured = (measure_saved(lambda: model._run(model.encoder, video, None), model)
                + measure_saved(lambda: model._run(model.decoder, latent, None), model))
    predicted = 0
    for comp in graph.components:
        predicted += _nodes_saved(comp, B, comp.seq_len, nbytes)
        predicted += sum(B * comp.seq_len * n.dim * nbytes for n in comp.nodes if isinstance(n, ChannelRMSNorm))
    assert [len(c.blocks()) for c in graph.components] == [0] * len(graph.components)
    assert measured == predicted


def test_blocks_and_planner_annotations_of_every_family():
    """Oracle: the Megatron layout by hand (q/k/v and FFN up column, o and FFN down row; VAE replicated) and
    the sequence-split kinds the nodes' lowerings allow."""
    _, graph, nodes = _dit_parts()
    block = nodes["block0"]
    dims = block.tp_dims()
    assert {dims[f"self_attn.{p}.weight"] for p in "qkv"} == {0} and dims["self_attn.o.weight"] == 1
    assert dims["cross_attn.o.bias"] is None and dims["ffn.up.weight"] == 0 and dims["ffn.down.weight"] == 1
    assert set(dims) == set(block.param_shapes())
    assert (DiTBlock.seq_split, DiTAttention.seq_split, MMBlock.seq_split) == ("context",) * 3
    assert PatchMerger.seq_split == "none" and PatchMerger(name="m", in_features=4, out_features=8).tp_dims() == {
        "norm.weight": None, "norm.bias": None, "fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1, "fc2.bias": None}
    text_proj = graph.component("text").nodes[0]
    assert text_proj.tp_dims() == {"linear_1.weight": 0, "linear_1.bias": 0, "linear_2.weight": 1,
                                   "linear_2.bias": None}
    for node in _vae_nodes(3):
        assert set(node.tp_dims()) == set(node.param_shapes()) and set(node.tp_dims().values()) <= {None}
        assert node.seq_split == ("local" if isinstance(node, ChannelRMSNorm) else "none")
    qwen = qwen2_vl.build_graph(qwen2_vl.qwen2_vl_config("tiny"), seq_len=16, image_patches=16)
    assert [len(c.blocks()) for c in qwen.components] == [2, 2]
    assert all(isinstance(b, MMBlock) for c in qwen.components for b in c.blocks())
    assert not any(isinstance(n, (Embedding, Norm)) for n in graph.component("video").blocks())


def test_forward_bytes_hand_counts_and_errors():
    """Oracle: the traffic model (every op reads its inputs and writes its outputs once, parameters read once)
    counted by hand for a quick-GELU FeedForward and a causal conv; every node of the families checks sizes."""
    ffn = FeedForward(name="f", dim=8, hidden=16, activation="quick_gelu")
    params = 2 * 8 * 16 + 16 + 8
    assert ffn.forward_bytes(1, 2, 2) == (2 * (8 + 16) + 7 * 2 * 16 + 2 * (16 + 8) + params) * 2
    conv = CausalConv3D(name="c", in_channels=2, out_channels=3, frames=2)
    stream, out = 2 * 4 * 2, 2 * 2 * 3  # (2 + 2 padding frames) x 2 pixels x 2 channels; 2 x 2 x 3 out
    assert conv.forward_bytes(1, 4, 4) == (stream + 4 * 2 + stream + out + 3 * 2 * 27 + 3) * 4
    _, graph, nodes = _dit_parts()
    family = [*FFN, *MM, PatchMerger(name="m", in_features=4, out_features=8), *nodes.values(),
              graph.component("text").nodes[0], *_vae_nodes(3)]
    for node in family:
        assert node.forward_bytes(2, 48, 2) > node.forward_bytes(1, 48, 2) > 0, node.name
        with pytest.raises(ValueError, match=rf"node '{node.name}' .*dtype_bytes must be a positive integer, got 0"):
            node.saved_bytes(1, 48, 0)
