"""Llama 3 recipe: decoder-only transformer with GQA, RoPE (llama3 scaling), SwiGLU and RMSNorm.

Follows Meta's Llama 3 / 3.1 / 3.2 models ("The Llama 3 Herd of Models",
arXiv 2407.21783) as implemented by HF ``transformers``' ``LlamaForCausalLM``:
pre-norm blocks ``x + attn(rms(x))``, ``x + swiglu(rms(x))``, no biases, a final
RMSNorm and a vocabulary head that is tied to the embedding (3.2 1B/3B) or not
(8B, 70B). ``lf_ir.interop.hf_llama`` converts HF checkpoints both ways.

Legend: ``ids_bs`` (batch, seq) int64; ``logits_bsv`` (batch, seq, vocab).
"""

from __future__ import annotations

from typing import Literal

import msgspec
import torch
from torch import nn

from lf_ir._graph import Component, Graph, validate
from lf_ir._lower import ComponentModule
from lf_ir._nodes import MLP, Attention, Embedding, LMHead, Norm, RoPE, TransformerBlock
from lf_ir.recipes._spec import RecipeSpec, lazy_function, register_recipe
from lf_kernels import MaskSpec


class Llama3Config(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of a Llama 3 model. Widths in features, lengths in tokens.

    Example:
        >>> llama3_config("8B").kv_heads
        8
    """

    vocab_size: int = 128256
    """Vocabulary size (rows of the embedding table, logits per token)."""
    dim: int = 4096
    """Model width (HF ``hidden_size``)."""
    layers: int = 32
    """Transformer blocks (HF ``num_hidden_layers``)."""
    heads: int = 32
    """Query heads; must divide ``dim`` (head_dim = dim / heads)."""
    kv_heads: int = 8
    """Key/value heads; must divide ``heads`` (GQA, arXiv 2305.13245)."""
    ffn_hidden: int = 14336
    """SwiGLU hidden width (HF ``intermediate_size``)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (HF ``rms_norm_eps``)."""
    rope_theta: float = 500000.0
    """RoPE base (HF ``rope_theta``)."""
    rope_scaling: Literal["none", "llama3"] = "llama3"
    """``"llama3"``: Llama 3.1 frequency scaling; ``"none"``: plain RoPE (Llama 3.0)."""
    rope_factor: float = 8.0
    """llama3 scaling: context extension factor (HF ``rope_scaling.factor``)."""
    rope_low_freq_factor: float = 1.0
    """llama3 scaling: HF ``rope_scaling.low_freq_factor``."""
    rope_high_freq_factor: float = 4.0
    """llama3 scaling: HF ``rope_scaling.high_freq_factor``."""
    rope_original_max_len: int = 8192
    """llama3 scaling: HF ``rope_scaling.original_max_position_embeddings``, tokens."""
    max_seq_len: int = 131072
    """Longest sequence the model is meant for (HF ``max_position_embeddings``), tokens."""
    tie_embeddings: bool = False
    """Whether the vocabulary head shares the embedding table (HF ``tie_word_embeddings``)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def rope(self) -> RoPE:
        """The RoPE settings every attention node carries."""
        return RoPE(theta=self.rope_theta, scaling=self.rope_scaling, factor=self.rope_factor,
                    low_freq_factor=self.rope_low_freq_factor, high_freq_factor=self.rope_high_freq_factor,
                    original_max_position_embeddings=self.rope_original_max_len)


SIZES: dict[str, dict] = {
    "tiny": dict(vocab_size=256, dim=64, layers=2, heads=4, kv_heads=2, ffn_hidden=160,
                 rope_theta=10000.0, rope_original_max_len=64, max_seq_len=256),
    "1B": dict(dim=2048, layers=16, heads=32, kv_heads=8, ffn_hidden=8192, rope_factor=32.0,
               tie_embeddings=True),
    "8B": {},
    "70B": dict(dim=8192, layers=80, heads=64, kv_heads=8, ffn_hidden=28672),
}
"""Named sizes, overrides of the Llama3Config defaults (which are Llama-3.1-8B).
``1B`` is Llama-3.2-1B; ``70B`` Llama-3.1-70B; ``tiny`` is for tests."""


def llama3_config(size: str = "8B", **overrides) -> Llama3Config:
    """The config of a named size (any case: ``"8b"`` = ``"8B"``) with field overrides.

    Raises:
        ValueError: unknown size (lists the sizes); TypeError: unknown field.
    """
    return SPEC.config(size, **overrides)


def build_graph(cfg: Llama3Config, seq_len: int | None = None) -> Graph:
    """The IR graph of a Llama 3 model; ``seq_len`` (default ``cfg.max_seq_len``) sets FLOP counts.

    One ``text`` component: ``embed``, blocks ``layer0..layer{L-1}``, ``norm``, ``head``.

    Raises:
        IRError: naming the node that does not fit (e.g. ``'layer0.attention'`` when
            ``dim`` is not divisible by ``heads`` or ``heads`` by ``kv_heads``).
    """
    rope = cfg.rope()
    blocks = [TransformerBlock(
        name=f"layer{i}",
        attn_norm=Norm(name=f"layer{i}.attn_norm", dim=cfg.dim, kind="rms", eps=cfg.norm_eps),
        attention=Attention(name=f"layer{i}.attention", dim=cfg.dim, heads=cfg.heads, kv_heads=cfg.kv_heads,
                            mask="causal", rope=rope),
        mlp_norm=Norm(name=f"layer{i}.mlp_norm", dim=cfg.dim, kind="rms", eps=cfg.norm_eps),
        mlp=MLP(name=f"layer{i}.mlp", dim=cfg.dim, hidden=cfg.ffn_hidden, activation="swiglu", bias=False),
    ) for i in range(cfg.layers)]
    text = Component(name="text", modality="text", seq_len=seq_len or cfg.max_seq_len, nodes=[
        Embedding(name="embed", num_embeddings=cfg.vocab_size, dim=cfg.dim),
        *blocks,
        Norm(name="norm", dim=cfg.dim, kind="rms", eps=cfg.norm_eps),
        LMHead(name="head", dim=cfg.dim, vocab_size=cfg.vocab_size,
               tied_to="embed" if cfg.tie_embeddings else None),
    ])
    return validate(Graph(name="llama3", recipe="llama3", components=[text]))


class Llama3Model(nn.Module):
    """The lowered Llama 3. Build under ``torch.device("meta")``, then ``lf_ir.materialize``.

    Example:
        >>> from lf_ir import materialize
        >>> with torch.device("meta"):
        ...     model = Llama3Model(llama3_config("tiny"))
        >>> model = materialize(model, "cpu", seed=0)
        >>> model(torch.zeros(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8, 256])
    """

    def __init__(self, cfg: Llama3Config, graph: Graph | None = None):
        super().__init__()
        self.cfg = cfg
        self.graph = graph if graph is not None else build_graph(cfg)
        self.components = nn.ModuleDict({c.name: ComponentModule(c) for c in self.graph.components})
        self.mask = MaskSpec(kind="causal")

    @property
    def blocks(self) -> list[nn.Module]:
        """The transformer blocks in order (for recompute and pipeline planning)."""
        return self.components["text"].blocks

    def forward(self, ids_bs: torch.Tensor, positions: torch.Tensor | None = None,
                key_padding: torch.Tensor | None = None, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, seq, vocab) for token ids (batch, seq) int64.

        positions: optional (batch, seq) int64 rotary positions (default 0..seq-1; restart them per
            document for packed sequences).
        key_padding: optional (batch, seq) bool, True = real token.
        document_ids: optional (batch, seq) int; packed documents attend only within themselves
            (causal + documents: the varlen case of lf-kernels' attention).

        Raises:
            ValueError: ``ids_bs`` is not 2-D.
        """
        if ids_bs.dim() != 2:
            raise ValueError(f"input_ids: expected (batch, seq), got shape {tuple(ids_bs.shape)}")
        return self.components["text"](ids_bs, mask=self.mask, key_padding=key_padding, positions=positions,
                                       document_ids=document_ids)


def next_token_loss(logits_bsv: torch.Tensor, ids_bs: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``ids[:, 1:]`` from ``logits[:, :-1]`` (HF's causal LM loss), float32."""
    vocab = logits_bsv.shape[-1]
    return nn.functional.cross_entropy(logits_bsv[:, :-1].reshape(-1, vocab).float(), ids_bs[:, 1:].reshape(-1))


SPEC = register_recipe(RecipeSpec(
    name="llama3", family="llm", config_class=Llama3Config, sizes=SIZES, build_graph=build_graph, model=Llama3Model,
    import_hf=lazy_function("lf_ir.interop", "import_hf_llama"),
    export_hf=lazy_function("lf_ir.interop", "export_hf_llama"),
    masks=("causal",), tensor_parallel=True, sequence_parallel=True, context_parallel=("ring", "ulysses"),
    pipeline=True, train_seq_len=8192))
"""The llama3 recipe (llm family). ``train_seq_len``: Llama 3 pre-training's 8192 tokens, the context before
long-context extension (arXiv 2407.21783 section 3.4), not the model's 131,072-token maximum."""
