"""Tiny lf-ir recipes and the inputs their blocks receive, shared by the tests."""

from __future__ import annotations

import functools

import torch

from lf_ir import Llama3Model, VLAModel, llama3_config, materialize, next_token_loss, vla_config
from lf_kernels import MaskSpec

BATCH = 2
LLAMA_SEQ = 24


@functools.cache
def _vla_state() -> dict:
    with torch.device("meta"):
        model = VLAModel(vla_config("tiny"))
    return materialize(model, "cpu", 0).state_dict()


def tiny_vla() -> VLAModel:
    """A fresh tiny VLA with fixed weights (seed 0)."""
    with torch.device("meta"):
        model = VLAModel(vla_config("tiny"))
    model.to_empty(device="cpu")
    model.load_state_dict(_vla_state())
    return model


def tiny_llama() -> Llama3Model:
    """A fresh tiny Llama 3 with fixed weights (seed 0)."""
    with torch.device("meta"):
        model = Llama3Model(llama3_config("tiny"))
    return materialize(model, "cpu", 0)


def vla_inputs(model: VLAModel, seed: int = 0) -> tuple:
    """(image, instruction_ids, instruction_mask, state, action_in_ids) for ``model``; some padding."""
    cfg, gen = model.cfg, torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (BATCH, cfg.image_size, cfg.image_size, 3), generator=gen, dtype=torch.uint8)
    ids = torch.randint(0, cfg.text_vocab_size, (BATCH, cfg.max_instruction_len), generator=gen)
    mask = torch.ones(BATCH, cfg.max_instruction_len, dtype=torch.bool)
    mask[0, 10:] = False
    state = torch.randn(BATCH, cfg.state_dim, generator=gen)
    actions = torch.randint(cfg.text_vocab_size, cfg.vocab_size, (BATCH, cfg.num_action_tokens - 1), generator=gen)
    return image, ids, mask, state, actions


def tiny_gemma():
    """A fresh tiny Gemma (GeGLU, ``1 + w`` RMSNorm, MQA) whose 4 heads of 16 are wider than dim / heads (48 / 4),
    with fixed weights (seed 0)."""
    from lf_ir.recipes.gemma import GemmaModel, gemma_config

    with torch.device("meta"):
        model = GemmaModel(gemma_config("tiny", dim=48, heads=4, kv_heads=1, head_dim=16))
    return materialize(model, "cpu", 0)


def llama_inputs(seed: int = 0) -> torch.Tensor:
    """Token ids (BATCH, LLAMA_SEQ) int64."""
    return torch.randint(0, 256, (BATCH, LLAMA_SEQ), generator=torch.Generator().manual_seed(seed))


def block_cases() -> list[tuple[str, torch.nn.Module, tuple, int, bool]]:
    """(name, block, args, seq, key_padding) for each kind of tiny block, args as the model passes them."""
    vla, llama, gemma = tiny_vla(), tiny_llama(), tiny_gemma()
    gen = torch.Generator().manual_seed(3)
    cfg = vla.cfg
    patches = (cfg.image_size // cfg.patch_size) ** 2
    padding = torch.ones(BATCH, cfg.seq_len, dtype=torch.bool)
    padding[0, patches + 10: patches + cfg.max_instruction_len] = False
    return [
        ("vla.vision", vla.components["vision"].blocks[0],
         (torch.randn(BATCH, patches, cfg.vision_dim, generator=gen), MaskSpec(kind="full")), patches, False),
        ("vla.backbone", vla.components["backbone"].blocks[0],
         (torch.randn(BATCH, cfg.seq_len, cfg.dim, generator=gen), vla.mask, padding), cfg.seq_len, True),
        ("llama3", llama.blocks[0],
         (torch.randn(BATCH, LLAMA_SEQ, llama.cfg.dim, generator=gen), llama.mask), LLAMA_SEQ, False),
        ("gemma", gemma.blocks[0],
         (torch.randn(BATCH, LLAMA_SEQ, gemma.cfg.dim, generator=gen), gemma.mask), LLAMA_SEQ, False),
    ]


def qwen_block_cases() -> list[tuple[str, torch.nn.Module, tuple, dict, int, bool]]:
    """(name, block, args, kwargs, seq, key_padding) for the tiny Qwen2-VL decoder and ViT blocks.

    The ViT block sees one image (one segment: the path the IR's ``MMAttention`` rule models).
    """
    from lf_ir import mrope_cos_sin, vision_rope_cos_sin
    from lf_ir.recipes.qwen2_vl import Qwen2VLModel, qwen2_vl_config

    with torch.device("meta"):
        model = Qwen2VLModel(qwen2_vl_config("tiny"))
    model = materialize(model, "cpu", 0)
    cfg, gen, seq, patches = model.cfg, torch.Generator().manual_seed(5), 16, 16
    pos = torch.arange(seq).expand(3, BATCH, seq)
    cos_sin = mrope_cos_sin(model._mrope, cfg.head_dim, pos, torch.float32)
    vcos, vsin = vision_rope_cos_sin(model._vision_rope, cfg.vision_head_dim,
                                     torch.randint(0, 4, (patches, 2), generator=gen))
    return [
        ("qwen2_vl.text", model.components["text"].blocks[0],
         (torch.randn(BATCH, seq, cfg.dim, generator=gen), model.mask, None), {"cos_sin": cos_sin}, seq, False),
        ("qwen2_vl.vision", model.components["vision"].blocks[0],
         (torch.randn(1, patches, cfg.vision_dim, generator=gen),),
         {"cos_sin": (vcos[None], vsin[None]), "segments": [patches]}, patches, False),
    ]


def recipe_case(recipe: str) -> tuple:
    """(fresh model, its inputs, forward, loss) for the tiny ``wan_dit``, ``vla_flow`` or ``qwen2_vl`` (seed 0).

    ``forward(model, inputs)`` is what the IR graph describes (Wan: the flow-matching loss, whose node is in
    the graph; the others: the model's output); ``loss(output, inputs)`` a float32 scalar. The Qwen2-VL case holds one
    image of 4x4 patches in a 24-token sample (one ViT segment: what the IR's byte rule models); the batch
    of the others is :data:`BATCH`. The models' graphs match the inputs' sizes.
    """
    from lf_ir.recipes.qwen2_vl import Qwen2VLModel, qwen2_vl_config
    from lf_ir.recipes.qwen2_vl import build_graph as qwen_graph
    from lf_ir.recipes.vla_flow import VLAFlowModel, vla_flow_config
    from lf_ir.recipes.wan_dit import WanDiTModel, wan_dit_config

    gen = torch.Generator().manual_seed(11)
    if recipe == "wan_dit":
        cfg = wan_dit_config("tiny", layers=4)
        with torch.device("meta"):
            model = WanDiTModel(cfg)  # graph at the config's video size: 3 x 3 x 5 latent tokens
        x0 = torch.randn(BATCH, cfg.in_channels, 3, 6, 10, generator=gen)
        inputs = (x0, torch.randn(BATCH, cfg.text_len, cfg.text_dim, generator=gen),
                  torch.randn(x0.shape, generator=gen), torch.rand(BATCH, generator=gen))
        return materialize(model, "cpu", 0), inputs, lambda m, args: m.flow_loss(*args), lambda out, args: out
    if recipe == "vla_flow":
        cfg = vla_flow_config("tiny")
        with torch.device("meta"):
            model = VLAFlowModel(cfg)
        mask = torch.ones(BATCH, cfg.max_instruction_len, dtype=torch.bool)
        mask[0, 5:] = False
        inputs = (torch.randint(0, 256, (BATCH, cfg.image_size, cfg.image_size, 3), generator=gen, dtype=torch.uint8),
                  torch.randint(0, cfg.text_vocab_size, (BATCH, cfg.max_instruction_len), generator=gen), mask,
                  torch.randn(BATCH, cfg.state_dim, generator=gen),
                  torch.randn(BATCH, cfg.action_horizon, cfg.action_dim, generator=gen),
                  torch.rand(BATCH, generator=gen))
        return materialize(model, "cpu", 0), inputs, lambda m, a: m(*a), lambda out, a: out.square().sum()
    if recipe == "qwen2_vl":
        cfg = qwen2_vl_config("tiny")
        with torch.device("meta"):
            model = Qwen2VLModel(cfg, qwen_graph(cfg, seq_len=24, image_patches=16))
        ids = torch.randint(0, 400, (1, 24), generator=gen)
        ids[:, 2:6] = cfg.image_token_id
        pixels = torch.randn(16, 3 * cfg.temporal_patch_size * cfg.patch_size ** 2, generator=gen)
        inputs = (ids, pixels, torch.tensor([[1, 4, 4]]))
        return materialize(model, "cpu", 0), inputs, lambda m, a: m(*a), lambda out, a: next_token_loss(out, a[0])
    raise ValueError(f"unknown recipe {recipe!r}")
