"""VLA recipe: a ViT patch encoder and a decoder-only transformer over action tokens.

Sequence layout per sample (the prefix attends bidirectionally, actions causally;
the prefix-LM mask of Raffel et al. 2020 / PaLI, as in OpenVLA, arXiv 2406.09246):

    [ image patches | instruction tokens (padded) | state | action tokens ]
      <------------------- prefix ------------------->   <-- causal ---->

Instruction and action tokens share one embedding table and one output head:
action bins occupy the reserved ids at the end of the vocabulary
(``lf_tokenize_action.ActionVocab``). Training is teacher-forced next-token
prediction on the action positions; inference decodes greedily over the action
range only.

Legend: ``x_bsd`` (batch, seq, dim); images are uint8 (batch, H, W, 3).
"""

from __future__ import annotations

from typing import Literal

import msgspec
import torch
from torch import nn

from lf_ir._graph import Component, Edge, Graph, validate
from lf_ir._lower import ComponentModule
from lf_ir._mask import Mask
from lf_ir._nodes import (
    MLP,
    Attention,
    Embedding,
    IRError,
    LearnedPositional,
    Linear,
    Norm,
    PatchEmbed2D,
    TransformerBlock,
)
from lf_ir._pipeline_glue import block_span, blocks_between
from lf_ir.recipes._spec import RecipeSpec, register_recipe
from lf_kernels import MaskSpec


class VLAConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of the VLA recipe. All widths in features, lengths in tokens."""

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
    text_vocab_size: int = 64
    """Instruction vocabulary (ids below this are text; action ids follow)."""
    n_action_bins: int = 256
    """Action token bins (reserved ids at the end of the vocabulary)."""
    max_instruction_len: int = 16
    """Instruction tokens per sample (padded)."""
    state_dim: int = 39
    """Proprioceptive state features."""
    action_dim: int = 4
    """Action dimensions per time step."""
    action_horizon: int = 4
    """Time steps per predicted action chunk."""
    action_tokens: int = 0
    """Action token positions per sample; 0: ``action_horizon * action_dim`` (one binned token per value).
    Variable-length tokenizers (FAST) set the longest encoding + 1 (the end-of-action token)."""
    dim: int = 192
    """Backbone width."""
    layers: int = 4
    """Backbone blocks."""
    heads: int = 6
    """Backbone query heads."""
    kv_heads: int = 6
    """Backbone key/value heads (GQA when smaller than heads)."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of the model width (when ``hidden`` / ``vision_hidden`` are 0)."""
    vision_hidden: int = 0
    """Vision encoder MLP hidden width; 0: ``vision_dim * mlp_ratio``."""
    hidden: int = 0
    """Backbone MLP hidden width; 0: ``dim * mlp_ratio``."""
    mlp_activation: Literal["gelu", "swiglu"] = "gelu"
    """Backbone MLPs: GELU with biases, or SwiGLU without (Llama's). The vision encoder's stay GELU."""

    @property
    def vision_mlp_hidden(self) -> int:
        """Vision encoder MLP hidden width in features."""
        return self.vision_hidden or self.vision_dim * self.mlp_ratio

    @property
    def mlp_hidden(self) -> int:
        """Backbone MLP hidden width in features."""
        return self.hidden or self.dim * self.mlp_ratio

    @property
    def vocab_size(self) -> int:
        return self.text_vocab_size + self.n_action_bins

    @property
    def num_action_tokens(self) -> int:
        """Action token positions per sample: ``action_tokens``, or ``action_horizon * action_dim`` when 0."""
        return self.action_tokens or self.action_horizon * self.action_dim

    @property
    def prefix_len(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + self.max_instruction_len + 1

    @property
    def seq_len(self) -> int:
        """Backbone input length in training: the prefix and all but the last action token."""
        return self.prefix_len + self.num_action_tokens - 1


SIZES: dict[str, dict[str, int | str]] = {
    "tiny": dict(vision_dim=32, vision_layers=1, vision_heads=2, dim=32, layers=2, heads=4,
                 kv_heads=2, mlp_ratio=2),
    "small": {},
    # OpenVLA-class (arXiv 2406.09246) at ~3.4B: a SigLIP-So400m/14-shaped encoder at 224 px (27 layers, 1152 wide,
    # MLP 4304; 256 patches) and a Llama-3.2-3B-shaped backbone (28 layers, 3072 wide, 24 query / 8 kv heads of
    # 128, SwiGLU 8192) over Llama 2's 32,000 text ids + 256 action bins, head untied. Differences from those
    # models: LayerNorm and learned positions instead of RMSNorm and RoPE; bias-free ViT attention projections.
    # Instruction, state and action chunk keep the Meta-World defaults (16 tokens, 39-d state, 4 x 4 actions).
    "3B": dict(image_size=224, patch_size=14, vision_dim=1152, vision_layers=27, vision_heads=16, vision_hidden=4304,
               text_vocab_size=32000, dim=3072, layers=28, heads=24, kv_heads=8, hidden=8192,
               mlp_activation="swiglu"),
}
"""Named sizes: overrides of the VLAConfig defaults ("small" is the Meta-World run)."""


def vla_config(size: str = "small", **overrides) -> VLAConfig:
    """The config of a named size (any case: ``"8b"`` = ``"8B"``) with field overrides.

    Raises:
        ValueError: unknown size (lists the sizes); TypeError: unknown field.
    """
    return SPEC.config(size, **overrides)


def _blocks(prefix: str, n: int, dim: int, heads: int, kv_heads: int, hidden: int,
            mask: str | Mask, activation: str = "gelu") -> list[TransformerBlock]:
    return [TransformerBlock(
        name=f"{prefix}{i}",
        attn_norm=Norm(name=f"{prefix}{i}.attn_norm", dim=dim),
        attention=Attention(name=f"{prefix}{i}.attention", dim=dim, heads=heads,
                            kv_heads=kv_heads, mask=mask),
        mlp_norm=Norm(name=f"{prefix}{i}.mlp_norm", dim=dim),
        mlp=MLP(name=f"{prefix}{i}.mlp", dim=dim, hidden=hidden, activation=activation,
                bias=activation == "gelu")) for i in range(n)]


def build_graph(cfg: VLAConfig) -> Graph:
    """The IR graph of a VLA with config ``cfg``; IRError naming the bad node."""
    patches = (cfg.image_size // cfg.patch_size) ** 2
    vision = Component(name="vision", modality="image", seq_len=patches, nodes=[
        PatchEmbed2D(name="patch", in_channels=3, image_size=cfg.image_size,
                     patch_size=cfg.patch_size, dim=cfg.vision_dim),
        LearnedPositional(name="pos", length=patches, dim=cfg.vision_dim),
        *_blocks("block", cfg.vision_layers, cfg.vision_dim, cfg.vision_heads,
                 cfg.vision_heads, cfg.vision_mlp_hidden, "full"),
        Norm(name="norm", dim=cfg.vision_dim),
        Linear(name="proj", in_features=cfg.vision_dim, out_features=cfg.dim),
    ])
    tokens = Component(name="tokens", modality="text",
                       seq_len=cfg.max_instruction_len + cfg.num_action_tokens - 1,
                       nodes=[Embedding(name="embed", num_embeddings=cfg.vocab_size, dim=cfg.dim)])
    state = Component(name="state", modality="state", seq_len=1, nodes=[
        Linear(name="proj", in_features=cfg.state_dim, out_features=cfg.dim)])
    backbone = Component(name="backbone", modality="sequence", seq_len=cfg.seq_len, nodes=[
        LearnedPositional(name="pos", length=cfg.seq_len, dim=cfg.dim),
        *_blocks("block", cfg.layers, cfg.dim, cfg.heads, cfg.kv_heads,
                 cfg.mlp_hidden, Mask(kind="prefix_lm", prefix_len=cfg.prefix_len), cfg.mlp_activation),
        Norm(name="norm", dim=cfg.dim),
        Linear(name="head", in_features=cfg.dim, out_features=cfg.vocab_size, bias=False),
    ])
    edges = [Edge(src="vision", src_node="proj", dst="backbone", kind="prefix_tokens"),
             Edge(src="tokens", src_node="embed", dst="backbone", kind="tokens"),
             Edge(src="state", src_node="proj", dst="backbone", kind="prefix_tokens")]
    return validate(Graph(name="vla", recipe="vla", components=[vision, tokens, state, backbone],
                          edges=edges))


class VLAModel(nn.Module):
    """The lowered VLA. Build under ``torch.device("meta")`` and materialize with lf_ir.materialize."""

    def __init__(self, cfg: VLAConfig, graph: Graph | None = None):
        super().__init__()
        self.cfg = cfg
        self.graph = graph if graph is not None else build_graph(cfg)
        self.components = nn.ModuleDict({c.name: ComponentModule(c) for c in self.graph.components})
        self.mask = MaskSpec(kind="prefix_lm", prefix_len=cfg.prefix_len)

    @property
    def blocks(self) -> list[nn.Module]:
        """All transformer blocks (vision then backbone), for recompute and planning."""
        return [b for c in self.components.values() for b in c.blocks]

    def encode_prefix(self, image: torch.Tensor, instruction_ids: torch.Tensor,
                      instruction_mask: torch.Tensor, state: torch.Tensor):
        """Prefix embeddings (batch, prefix_len, dim) and its key padding (batch, prefix_len) bool.

        image uint8 (batch, H, W, 3); instruction_ids int64 (batch, max_instruction_len);
        instruction_mask bool (same, True = real token); state float32 (batch, state_dim), normalized.
        """
        cfg, comps = self.cfg, self.components
        if image.shape[1:] != (cfg.image_size, cfg.image_size, 3):
            raise ValueError(f"image: expected (batch, {cfg.image_size}, {cfg.image_size}, 3), "
                             f"got {tuple(image.shape)}")
        dtype = self.components["state"].layers[0].weight.dtype
        pixels = image.permute(0, 3, 1, 2).to(dtype) * (2.0 / 255.0) - 1.0  # uint8 -> [-1, 1]
        vision = comps["vision"](pixels, mask=MaskSpec(kind="full"))
        text = comps["tokens"](instruction_ids)
        state_tok = comps["state"](state.to(vision.dtype)).unsqueeze(1)
        prefix = torch.cat([vision, text, state_tok], dim=1)
        b = image.shape[0]
        ones = torch.ones(b, vision.shape[1], dtype=torch.bool, device=image.device)
        padding = torch.cat([ones, instruction_mask.bool(), ones[:, :1]], dim=1)
        return prefix, padding

    def decode(self, prefix: torch.Tensor, padding: torch.Tensor,
               action_in_ids: torch.Tensor) -> torch.Tensor:
        """Logits (batch, 1 + n_in, vocab) for the action positions after ``prefix``.

        Position j predicts action token j given the prefix and action tokens < j.
        """
        x, pad = self._backbone_in(prefix, padding, action_in_ids)
        return self.trunk_head(self.trunk_blocks(x, pad), pad)

    def _backbone_in(self, prefix: torch.Tensor, padding: torch.Tensor,
                     action_in_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        backbone = self.components["backbone"]
        x = torch.cat([prefix, self.components["tokens"](action_in_ids)], dim=1)
        pad = torch.cat([padding, torch.ones_like(action_in_ids, dtype=torch.bool)], dim=1)
        return backbone(x, stop=block_span(backbone)[0]), pad

    def embed_inputs(self, image, instruction_ids, instruction_mask, state,
                     action_in_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Pipeline glue (:mod:`lf_ir._pipeline_glue`): :meth:`forward`'s inputs -> ``(x_bsd, key_padding_bs)``.

        ``x_bsd`` (batch, seq, dim): prefix and action-token embeddings with positions added;
        ``key_padding_bs`` (batch, seq) bool, True = real token.

        Raises:
            ValueError: as :meth:`forward`.
        """
        n_in = self.cfg.num_action_tokens - 1
        if action_in_ids.shape[1] != n_in:
            raise ValueError(f"action_in_ids: expected {n_in} tokens, got {action_in_ids.shape[1]}")
        prefix, padding = self.encode_prefix(image, instruction_ids, instruction_mask, state)
        return self._backbone_in(prefix, padding, action_in_ids)

    def trunk_blocks(self, x_bsd: torch.Tensor, key_padding_bs: torch.Tensor, *, start: int = 0,
                     stop: int | None = None) -> torch.Tensor:
        """Pipeline glue: the backbone blocks among its nodes ``[start, stop)``; (batch, seq, dim) in and out."""
        for block in blocks_between(self.components["backbone"], start, stop):
            x_bsd = block(x_bsd, self.mask, key_padding_bs)
        return x_bsd

    def trunk_head(self, x_bsd: torch.Tensor, *side: torch.Tensor) -> torch.Tensor:
        """Pipeline glue: final norm and head, logits at the action positions (batch, n_actions, vocab).

        The norm and head run on every position, as the IR graph (and so its FLOPs and saved bytes) says.
        """
        backbone = self.components["backbone"]
        return backbone(x_bsd, start=block_span(backbone)[1])[:, self.cfg.prefix_len - 1:]

    def forward(self, image, instruction_ids, instruction_mask, state, action_in_ids):
        """Teacher-forced logits (batch, num_action_tokens, vocab); see encode_prefix for inputs.

        action_in_ids int64 (batch, num_action_tokens - 1): the action tokens shifted right.
        """
        x_bsd, padding = self.embed_inputs(image, instruction_ids, instruction_mask, state, action_in_ids)
        return self.trunk_head(self.trunk_blocks(x_bsd, padding), padding)

    def loss_normalizer(self, batch) -> torch.Tensor:
        """Target action tokens in ``batch`` (labels other than -100): what the loss sum is divided by."""
        return (batch["labels"] != -100).sum()

    def training_loss(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(summed cross-entropy of the action tokens, float32; ``{"token_accuracy": correct tokens}``).

        ``batch``: the inputs of :meth:`forward` by name and ``labels`` int64 (batch,
        num_action_tokens), -100 where ignored. Divide by :meth:`loss_normalizer` for the mean.
        """
        logits = self(batch["image"], batch["instruction_ids"], batch["instruction_mask"], batch["state"],
                      batch["action_in_ids"])
        labels = batch["labels"]
        with torch.autocast(logits.device.type, enabled=False):
            logits = logits.float()
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum",
                                               ignore_index=-100)
        correct = ((logits.argmax(-1) == labels) & (labels != -100)).sum()
        return loss, {"token_accuracy": correct}

    @torch.no_grad()
    def generate(self, image, instruction_ids, instruction_mask, state, *, eos_id: int | None = None) -> torch.Tensor:
        """Greedy action tokens (batch, num_action_tokens) int64, restricted to the action ids.

        With ``eos_id`` (an action id ending a variable-length sequence, FAST's end-of-action) decoding stops
        once every row holds it, so the output may be shorter: (batch, <= num_action_tokens); tokens after a
        row's first ``eos_id`` are whatever was decoded while other rows went on.
        """
        cfg = self.cfg
        prefix, padding = self.encode_prefix(image, instruction_ids, instruction_mask, state)
        out = torch.empty(image.shape[0], 0, dtype=torch.long, device=image.device)
        for _ in range(cfg.num_action_tokens):
            logits = self.decode(prefix, padding, out)[:, -1, cfg.text_vocab_size:]
            out = torch.cat([out, logits.argmax(-1, keepdim=True) + cfg.text_vocab_size], dim=1)
            if eos_id is not None and bool((out == eos_id).any(dim=1).all()):
                break
        return out


def check_vocab(cfg: VLAConfig, text_vocab_size: int) -> None:
    """IRError if a text tokenizer of ``text_vocab_size`` ids does not fit ``cfg``."""
    if text_vocab_size > cfg.text_vocab_size:
        raise IRError(f"node 'tokens.embed': text vocabulary of {text_vocab_size} ids exceeds "
                      f"model.text_vocab_size={cfg.text_vocab_size}")


SPEC = register_recipe(RecipeSpec(
    name="vla", family="vla", config_class=VLAConfig, sizes=SIZES, build_graph=build_graph, model=VLAModel,
    masks=("full", "prefix_lm"), tensor_parallel=True, sequence_parallel=True, pipeline=True))
"""The vla recipe (action tokens). Its vocabulary sizes (``text_vocab_size``, the action ids) come from the
run's fitted tokenizers as overrides; the named sizes carry defaults that build on their own."""
