"""Gemma recipe: decoder-only transformer with MQA/GQA, RoPE, GeGLU and zero-centered RMSNorm.

Follows Google DeepMind's Gemma 1 ("Gemma: Open Models Based on Gemini Research and
Technology", arXiv 2403.08295) as implemented by HF ``transformers``' ``GemmaForCausalLM``:
token embeddings times ``sqrt(dim)`` (rounded to the table's dtype), pre-norm blocks
``x + attn(rms(x))``, ``x + geglu(rms(x))`` with the RMSNorms scaling by ``1 + w`` in
float32, GeGLU with the tanh-approximated GELU, RoPE (theta 10000) over heads of
``head_dim`` features (256, independent of ``dim / heads``), no biases, a final
RMSNorm and a vocabulary head tied to the embedding. ``lf_ir.interop.hf_gemma``
converts HF checkpoints both ways.

Legend: ``ids_bs`` (batch, seq) int64; ``logits_bsv`` (batch, seq, vocab).
"""

from __future__ import annotations

import math

import msgspec
import torch
from torch import nn

from lf_ir._graph import Component, Graph, validate
from lf_ir._lower import ComponentModule
from lf_ir._nodes import MLP, Attention, Embedding, LMHead, Norm, RoPE, TransformerBlock
from lf_ir.recipes._spec import RecipeSpec, lazy_function, register_recipe
from lf_ir.recipes.llama3 import next_token_loss
from lf_kernels import MaskSpec

__all__ = ["SIZES", "SPEC", "GemmaConfig", "GemmaModel", "build_graph", "gemma_config", "next_token_loss"]


class GemmaConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of a Gemma 1 model. Widths in features, lengths in tokens.

    Example:
        >>> gemma_config("2B").kv_heads
        1
    """

    vocab_size: int = 256000
    """Vocabulary size (rows of the embedding table, logits per token)."""
    dim: int = 3072
    """Model width (HF ``hidden_size``)."""
    layers: int = 28
    """Transformer blocks (HF ``num_hidden_layers``)."""
    heads: int = 16
    """Query heads (HF ``num_attention_heads``)."""
    kv_heads: int = 16
    """Key/value heads; must divide ``heads`` (1: multi-query attention, arXiv 1911.02150)."""
    head_dim: int = 256
    """Features per head (HF ``head_dim``); q and the attention output are ``heads * head_dim`` wide."""
    ffn_hidden: int = 24576
    """GeGLU hidden width (HF ``intermediate_size``)."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon (HF ``rms_norm_eps``)."""
    rope_theta: float = 10000.0
    """RoPE base (HF ``rope_theta``)."""
    max_seq_len: int = 8192
    """Longest sequence the model is meant for (HF ``max_position_embeddings``), tokens."""

    def rope(self) -> RoPE:
        """The RoPE settings every attention node carries (plain RoPE, rotate-half pairing)."""
        return RoPE(theta=self.rope_theta)


SIZES: dict[str, dict] = {
    "tiny": dict(vocab_size=256, dim=64, layers=2, heads=4, kv_heads=1, head_dim=16, ffn_hidden=160,
                 max_seq_len=256),
    "2B": dict(dim=2048, layers=18, heads=8, kv_heads=1, ffn_hidden=16384),
    "7B": {},
}
"""Named sizes, overrides of the GemmaConfig defaults (which are gemma-7b). ``2B`` is gemma-2b
(multi-query); ``tiny`` is for tests."""


def gemma_config(size: str = "7B", **overrides) -> GemmaConfig:
    """The config of a named size (case-insensitive: ``2b`` = ``2B``) with field overrides.

    Raises:
        ValueError: an unknown size, naming the known ones.
    """
    known = {k.lower(): k for k in SIZES}
    if not isinstance(size, str) or size.lower() not in known:
        raise ValueError(f"model.size: unknown gemma size {size!r}; expected one of {sorted(SIZES)}")
    return GemmaConfig(**{**SIZES[known[size.lower()]], **overrides})


def build_graph(cfg: GemmaConfig, seq_len: int | None = None) -> Graph:
    """The IR graph of a Gemma model; ``seq_len`` (default ``cfg.max_seq_len``) sets FLOP counts.

    One ``text`` component: ``embed`` (scaled by ``sqrt(dim)``; vocab-parallel under tensor parallelism,
    as the head tied to it), blocks ``layer0..layer{L-1}``, ``norm``, ``head`` (tied to ``embed``).

    Raises:
        IRError: naming the node that does not fit (e.g. ``'layer0.attention'`` when ``heads``
            is not divisible by ``kv_heads``, or ``head_dim`` is odd).
    """
    rope = cfg.rope()

    def norm(name: str) -> Norm:
        return Norm(name=name, dim=cfg.dim, kind="rms", eps=cfg.norm_eps, zero_centered_gamma=True)

    blocks = [TransformerBlock(
        name=f"layer{i}",
        attn_norm=norm(f"layer{i}.attn_norm"),
        attention=Attention(name=f"layer{i}.attention", dim=cfg.dim, heads=cfg.heads, kv_heads=cfg.kv_heads,
                            mask="causal", rope=rope, kv_channels=cfg.head_dim),
        mlp_norm=norm(f"layer{i}.mlp_norm"),
        mlp=MLP(name=f"layer{i}.mlp", dim=cfg.dim, hidden=cfg.ffn_hidden, activation="geglu_tanh", bias=False),
    ) for i in range(cfg.layers)]
    text = Component(name="text", modality="text", seq_len=seq_len or cfg.max_seq_len, nodes=[
        # vocab-parallel table (tp="row"): the tied head then splits the vocabulary with it under tensor parallelism
        Embedding(name="embed", num_embeddings=cfg.vocab_size, dim=cfg.dim, tp="row", scale=math.sqrt(cfg.dim)),
        *blocks,
        norm("norm"),
        LMHead(name="head", dim=cfg.dim, vocab_size=cfg.vocab_size, tied_to="embed"),
    ])
    return validate(Graph(name="gemma", recipe="gemma", components=[text]))


class GemmaModel(nn.Module):
    """The lowered Gemma. Build under ``torch.device("meta")``, then ``lf_ir.materialize``.

    Example:
        >>> from lf_ir import materialize
        >>> with torch.device("meta"):
        ...     model = GemmaModel(gemma_config("tiny"))
        >>> model = materialize(model, "cpu", seed=0)
        >>> model(torch.zeros(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8, 256])
    """

    def __init__(self, cfg: GemmaConfig, graph: Graph | None = None):
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

        positions: optional (batch, seq) int64 rotary positions (default 0..seq-1).
        key_padding: optional (batch, seq) bool, True = real token.
        document_ids: optional (batch, seq) int; packed documents attend only within themselves.

        Raises:
            ValueError: ``ids_bs`` is not 2-D.
        """
        if ids_bs.dim() != 2:
            raise ValueError(f"input_ids: expected (batch, seq), got shape {tuple(ids_bs.shape)}")
        return self.components["text"](ids_bs, mask=self.mask, key_padding=key_padding, positions=positions,
                                       document_ids=document_ids)


SPEC = register_recipe(RecipeSpec(
    name="gemma", family="llm", config_class=GemmaConfig, sizes=SIZES, build_graph=build_graph, model=GemmaModel,
    import_hf=lazy_function("lf_ir.interop.hf_gemma", "import_hf_gemma"),
    export_hf=lazy_function("lf_ir.interop.hf_gemma", "export_hf_gemma"),
    masks=("causal",), tensor_parallel=True, sequence_parallel=True, context_parallel=("ring", "ulysses"),
    pipeline=False, train_seq_len=8192))
"""The gemma recipe (llm family): its one ``text`` component is llama3's shape, so the llm family trains it under
data, ZeRO, tensor (+ sequence) and context parallel plans (tp needs ``kv_heads`` divisible by tp: gemma-2b's
single kv head takes none), and ``lf convert`` reads and writes HF Gemma folders. Not pipelined: its head is tied
to the embedding, which would sit on another stage. ``train_seq_len``: Gemma's 8192-token context."""
