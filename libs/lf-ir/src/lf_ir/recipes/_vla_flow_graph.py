"""Config, sizes and IR graph of the flow-matching VLA (pi0); the model and the full description: ``vla_flow``."""

from __future__ import annotations

from typing import Literal

import msgspec

from lf_ir._graph import Component, Edge, Graph, validate
from lf_ir._nodes import Embedding, IRError, LearnedPositional, Linear, Norm, PatchEmbed2D
from lf_ir._nodes_expert import ActionTimeEmbed, JointAttentionBlock
from lf_ir._nodes_flow import FlowMatchingLoss
from lf_ir.recipes._spec import recipe_spec
from lf_ir.recipes.vla import _blocks

TimeDistribution = Literal["beta", "uniform", "logit_normal"]


class VLAFlowConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of the flow-matching VLA. Widths in features, lengths in tokens."""

    image_size: int = 64
    """Square camera image side, pixels."""
    patch_size: int = 16
    """ViT patch side, pixels."""
    vision_dim: int = 128
    """Vision encoder width."""
    vision_layers: int = 2
    """Vision encoder blocks."""
    vision_heads: int = 4
    """Vision encoder attention heads."""
    vision_hidden: int = 512
    """Vision encoder MLP hidden width."""
    text_vocab_size: int = 64
    """Instruction vocabulary size."""
    max_instruction_len: int = 16
    """Instruction tokens per sample (padded)."""
    state_dim: int = 39
    """Proprioceptive state features (one prefix token)."""
    action_dim: int = 4
    """Action dimensions per time step."""
    action_horizon: int = 4
    """Time steps per action chunk (the suffix tokens H)."""
    dim: int = 192
    """Backbone width."""
    layers: int = 4
    """Joint layers (backbone and action expert alike)."""
    heads: int = 6
    """Query heads of both experts."""
    kv_heads: int = 6
    """Key/value heads of both experts."""
    head_dim: int = 32
    """Features per attention head of both experts."""
    hidden: int = 768
    """Backbone MLP hidden width."""
    expert_dim: int = 96
    """Action-expert width."""
    expert_hidden: int = 384
    """Action-expert MLP hidden width."""
    mlp_activation: Literal["gelu", "swiglu"] = "gelu"
    """Joint layers' MLPs: GELU with biases, or SwiGLU without (the shapes and FLOPs of Gemma's GeGLU)."""
    sample_steps: int = 10
    """Euler steps of :meth:`VLAFlowModel.sample_actions` (pi0: 10)."""
    time_distribution: TimeDistribution = "beta"
    """Training flow-time distribution: pi0's ``beta``, ``uniform`` or SD3's ``logit_normal``."""

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def prefix_len(self) -> int:
        """Prefix tokens P: image patches, instruction tokens, one state token."""
        return self.num_patches + self.max_instruction_len + 1

    @property
    def seq_len(self) -> int:
        """Joint sequence per sample: the prefix and the H action tokens."""
        return self.prefix_len + self.action_horizon


SIZES: dict[str, dict[str, int | str]] = {
    "tiny": dict(vision_dim=32, vision_layers=1, vision_heads=2, vision_hidden=64, dim=32, layers=2, heads=4,
                 kv_heads=2, head_dim=8, hidden=64, expert_dim=16, expert_hidden=32),
    "small": {},
    # pi0-like (arXiv 2410.24164 appendix B): SigLIP-So400m/14 at 224 px (27 layers, 1152 wide), Gemma-2B
    # (18 layers, 2048 wide, 8 query heads, 1 kv head of 256, vocabulary 257152) and the 300M action expert
    # (1024 wide, MLP 4096), H = 50, 32-d actions and state. Differences: one camera (pi0: up to three),
    # SwiGLU where Gemma has GeGLU (same shapes), LayerNorm and learned positions instead of RMSNorm and RoPE,
    # a GELU ViT with bias-free attention projections.
    "3B": dict(image_size=224, patch_size=14, vision_dim=1152, vision_layers=27, vision_heads=16,
               vision_hidden=4304, text_vocab_size=257152, max_instruction_len=48, state_dim=32, action_dim=32,
               action_horizon=50, dim=2048, layers=18, heads=8, kv_heads=1, head_dim=256, hidden=16384,
               expert_dim=1024, expert_hidden=4096, mlp_activation="swiglu"),
}
"""Named sizes: overrides of the VLAFlowConfig defaults ("small" is the Meta-World run)."""


def vla_flow_config(size: str = "small", **overrides) -> VLAFlowConfig:
    """The config of a named size (any case: ``"8b"`` = ``"8B"``) with field overrides.

    Raises:
        ValueError: unknown size (lists the sizes); TypeError: unknown field.
    """
    return recipe_spec("vla_flow").config(size, **overrides)


def build_graph(cfg: VLAFlowConfig) -> Graph:
    """The IR graph of a flow-matching VLA; IRError naming the bad node or field.

    Components: ``vision`` (ViT, projected to the backbone width), ``tokens``
    (instruction embedding), ``state`` (one token), ``action_expert`` (the suffix's
    action/time input, positions, and its output norm, velocity head and loss) and
    ``backbone`` (prefix positions and the joint-attention layers, which hold both
    experts' weights; ``seq_len`` = P + H).
    """
    if cfg.time_distribution not in ("beta", "uniform", "logit_normal"):
        raise IRError(f"vla_flow: time_distribution must be 'beta', 'uniform' or 'logit_normal', "
                      f"got {cfg.time_distribution!r}")
    if cfg.layers < 1:
        raise IRError(f"vla_flow: layers must be >= 1, got {cfg.layers}")
    if cfg.sample_steps < 1:
        raise IRError(f"vla_flow: sample_steps must be >= 1, got {cfg.sample_steps}")
    if cfg.image_size % cfg.patch_size:
        raise IRError(f"vla_flow: patch_size {cfg.patch_size} must divide image_size {cfg.image_size}")
    patches, h = cfg.num_patches, cfg.action_horizon
    vision = Component(name="vision", modality="image", seq_len=patches, nodes=[
        PatchEmbed2D(name="patch", in_channels=3, image_size=cfg.image_size, patch_size=cfg.patch_size,
                     dim=cfg.vision_dim),
        LearnedPositional(name="pos", length=patches, dim=cfg.vision_dim),
        *_blocks("block", cfg.vision_layers, cfg.vision_dim, cfg.vision_heads, cfg.vision_heads,
                 cfg.vision_hidden, "full"),
        Norm(name="norm", dim=cfg.vision_dim),
        Linear(name="proj", in_features=cfg.vision_dim, out_features=cfg.dim),
    ])
    tokens = Component(name="tokens", modality="text", seq_len=cfg.max_instruction_len,
                       nodes=[Embedding(name="embed", num_embeddings=cfg.text_vocab_size, dim=cfg.dim)])
    state = Component(name="state", modality="state", seq_len=1,
                      nodes=[Linear(name="proj", in_features=cfg.state_dim, out_features=cfg.dim)])
    expert = Component(name="action_expert", modality="action", seq_len=h, nodes=[
        ActionTimeEmbed(name="embed", action_dim=cfg.action_dim, width=cfg.expert_dim),
        LearnedPositional(name="pos", length=h, dim=cfg.expert_dim),
        Norm(name="norm", dim=cfg.expert_dim),
        Linear(name="head", in_features=cfg.expert_dim, out_features=cfg.action_dim),
        FlowMatchingLoss(name="loss", dim=cfg.action_dim),
    ])
    backbone = Component(name="backbone", modality="sequence", seq_len=cfg.seq_len, nodes=[
        LearnedPositional(name="pos", length=cfg.prefix_len, dim=cfg.dim),
        *[JointAttentionBlock(name=f"block{i}", dim=cfg.dim, expert_dim=cfg.expert_dim, heads=cfg.heads,
                              kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, hidden=cfg.hidden,
                              expert_hidden=cfg.expert_hidden, suffix_len=h, prefix_kv_only=i == cfg.layers - 1,
                              mlp_activation=cfg.mlp_activation)
          for i in range(cfg.layers)],
    ])
    last = f"block{cfg.layers - 1}"
    edges = [Edge(src="vision", src_node="proj", dst="backbone", kind="prefix_tokens"),
             Edge(src="tokens", src_node="embed", dst="backbone", kind="prefix_tokens"),
             Edge(src="state", src_node="proj", dst="backbone", kind="prefix_tokens"),
             Edge(src="action_expert", src_node="pos", dst="backbone", kind="tokens"),
             Edge(src="backbone", src_node=last, dst="action_expert", kind="tokens")]
    return validate(Graph(name="vla_flow", recipe="vla_flow",
                          components=[vision, tokens, state, expert, backbone], edges=edges))
