"""Lowering: IR nodes -> ``torch.nn.Module``s, on the meta device, with deterministic init.

Every lowered module carries the node it came from as ``module.lf_node`` so
parallel and memory planners find what they need (which blocks exist, which
linear is column- or row-parallel) without knowing the model family.

Initialization is deterministic per node: each parameter draws from a generator
seeded by ``crc32(f"{seed}:{qualified name}")``, so the same weights come out
whatever the build order, device or parallel plan.

Legend: ``x_bsd`` is (batch, seq, dim); ``q_bhsd`` is (batch, heads, seq, head_dim).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import torch
from torch import nn

from lf_ir._fused import RMSNormModule, fusable, rotary_fits
from lf_ir._graph import Component
from lf_ir._nodes import (
    MLP,
    Attention,
    Embedding,
    LearnedPositional,
    Linear,
    LMHead,
    Norm,
    PatchEmbed2D,
    TransformerBlock,
    _Node,
)
from lf_ir._rope_torch import apply_rope, rope_cos_sin
from lf_kernels import MaskSpec, apply_rotary, attention, swiglu

INIT_STD = 0.02
"""Standard deviation of the normal init for weights (GPT-2 / ViT convention)."""


class PatchEmbedModule(nn.Module):
    """(batch, channels, H, W) float -> (batch, patches, dim) by a strided conv."""

    def __init__(self, node: PatchEmbed2D):
        super().__init__()
        self.conv = nn.Conv2d(node.in_channels, node.dim, node.patch_size, stride=node.patch_size)

    def forward(self, image_bchw: torch.Tensor) -> torch.Tensor:
        return self.conv(image_bchw).flatten(2).transpose(1, 2)


class LearnedPositionalModule(nn.Module):
    """Adds a learned (length, dim) table to the first ``seq`` positions."""

    def __init__(self, node: LearnedPositional):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(node.length, node.dim))

    def forward(self, x_bsd: torch.Tensor) -> torch.Tensor:
        return x_bsd + self.weight[: x_bsd.shape[1]]


class AttentionModule(nn.Module):
    """GQA self-attention through :func:`lf_kernels.attention`, with RoPE when the node has one.

    ``positions`` (batch, seq) int64 gives each token's rotary position
    (default ``0..seq-1``); it is ignored without RoPE. ``document_ids`` (batch, seq)
    int marks packed documents: attention also stays within a document (lf-kernels).
    With ``fused`` set (:func:`lf_ir.use_fused_ops`) the rotation runs :func:`lf_kernels.apply_rotary`
    on the same cos/sin tables.
    """

    fused: bool = False

    def __init__(self, node: Attention):
        super().__init__()
        kv = node.kv_heads * node.head_dim
        self.heads, self.kv_heads, self.head_dim = node.heads, node.kv_heads, node.head_dim
        self.rope = node.rope
        self.q = nn.Linear(node.dim, node.inner_dim, bias=node.bias)
        self.k = nn.Linear(node.dim, kv, bias=node.bias)
        self.v = nn.Linear(node.dim, kv, bias=node.bias)
        self.o = nn.Linear(node.inner_dim, node.dim, bias=node.bias)

    def forward(self, x_bsd: torch.Tensor, mask: MaskSpec, key_padding: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x_bsd.shape
        q_bhsd = self.q(x_bsd).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k_bhsd = self.k(x_bsd).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v_bhsd = self.v(x_bsd).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope is not None:
            if positions is None:
                positions = torch.arange(s, device=x_bsd.device).expand(b, s)
            cos, sin = rope_cos_sin(self.rope, self.head_dim, positions, q_bhsd.dtype)
            if self.fused and rotary_fits(q_bhsd, cos, sin) and rotary_fits(k_bhsd, cos, sin):
                q_bhsd, k_bhsd = apply_rotary(q_bhsd, cos, sin), apply_rotary(k_bhsd, cos, sin)
            else:
                q_bhsd, k_bhsd = apply_rope(q_bhsd, cos, sin), apply_rope(k_bhsd, cos, sin)
        docs = {} if document_ids is None else {"document_ids": document_ids}
        out_bhsd = attention(q_bhsd, k_bhsd, v_bhsd, mask, key_padding=key_padding, **docs)
        return self.o(out_bhsd.transpose(1, 2).reshape(b, s, -1))


class MLPModule(nn.Module):
    """GELU MLP, SwiGLU or GeGLU (tanh GELU) on the last dim; with ``fused`` set, SwiGLU runs :func:`lf_kernels.swiglu`.

    A GeGLU module has no fused op (``has_fused_op`` False): :func:`lf_ir.use_fused_ops` leaves it alone.
    """

    fused: bool = False

    def __init__(self, node: MLP):
        super().__init__()
        self.swiglu = node.activation == "swiglu"
        self.geglu_tanh = node.activation == "geglu_tanh"
        self.has_fused_op = not self.geglu_tanh
        self.up = nn.Linear(node.dim, node.hidden, bias=node.bias)
        self.down = nn.Linear(node.hidden, node.dim, bias=node.bias)
        if node.gated:
            self.gate = nn.Linear(node.dim, node.hidden, bias=node.bias)

    def forward(self, x_bsd: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = self.gate(x_bsd), self.up(x_bsd)
            if self.fused and fusable(gate, up):
                return self.down(swiglu(gate, up))
            return self.down(nn.functional.silu(gate) * up)
        if self.geglu_tanh:  # HF's GemmaMLP: down(gelu_pytorch_tanh(gate(x)) * up(x))
            return self.down(nn.functional.gelu(self.gate(x_bsd), approximate="tanh") * self.up(x_bsd))
        return self.down(nn.functional.gelu(self.up(x_bsd)))


class ZeroCenteredRMSNormModule(nn.Module):
    """RMSNorm scaled by ``1 + weight`` (weight initialized to 0), HF's ``GemmaRMSNorm`` op for op.

    ``y = (x.float() * rsqrt(mean(x.float()^2, -1) + eps) * (1 + weight.float())).to(x.dtype)``:
    statistics and scale in float32 for float32 / bfloat16 / float16 inputs (Gemma multiplies before casting
    back); a float64 input stays in float64 (where HF would round to float32), so float64 references stay exact.
    No fused op covers it: no ``fused`` flag, :func:`lf_ir.use_fused_ops` skips it.

    forward: ``x`` ``(..., dim)`` float -> same shape and dtype.
    """

    zero_centered_gamma = True
    """Tells :func:`init_weights` to start the weight at 0 (the identity scale)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(compute)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.to(compute))).type_as(x)


class ScaledEmbedding(nn.Embedding):
    """``nn.Embedding`` whose rows are multiplied by ``scale`` rounded to the table's dtype (HF's Gemma embedding).

    Same parameter (``weight`` (vocab, dim)) and state-dict key as ``nn.Embedding``.
    forward: ids (batch, seq) int64 -> (batch, seq, dim) in the table's dtype.
    """

    def __init__(self, num_embeddings: int, dim: int, scale: float):
        super().__init__(num_embeddings, dim)
        self.scale = float(scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = super().forward(ids)
        return rows * torch.tensor(self.scale, dtype=rows.dtype, device=rows.device)


def _lower_norm(node: Norm) -> nn.Module:
    if node.kind == "layer":
        return nn.LayerNorm(node.dim, eps=node.eps)
    if node.zero_centered_gamma:
        return ZeroCenteredRMSNormModule(node.dim, eps=node.eps)
    return RMSNormModule(node.dim, eps=node.eps)


def _lower_embedding(node: Embedding) -> nn.Module:
    if node.scale is msgspec.UNSET:
        return nn.Embedding(node.num_embeddings, node.dim)
    return ScaledEmbedding(node.num_embeddings, node.dim, node.scale)


class TransformerBlockModule(nn.Module):
    """Pre-norm residual transformer block; the mask kind comes from the IR node."""

    def __init__(self, node: TransformerBlock):
        super().__init__()
        self.mask_kind = node.attention.mask_spec.kind
        self.attn_norm = lower_node(node.attn_norm)
        self.attention = lower_node(node.attention)
        self.mlp_norm = lower_node(node.mlp_norm)
        self.mlp = lower_node(node.mlp)

    def forward(self, x_bsd: torch.Tensor, mask: MaskSpec, key_padding: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        docs = {} if document_ids is None else {"document_ids": document_ids}
        x_bsd = x_bsd + self.attention(self.attn_norm(x_bsd), mask, key_padding, positions, **docs)
        return x_bsd + self.mlp(self.mlp_norm(x_bsd))


class LMHeadModule(nn.Module):
    """Logits (batch, seq, vocab) = x (batch, seq, dim) @ weight.T, weight own or tied.

    A tied head registers no parameter: it reads the weight of the embedding
    module given to :meth:`tie` at every call, so the tie survives ``to_empty``,
    dtype casts and loading a state dict (which then has no head entry).
    """

    def __init__(self, node: LMHead):
        super().__init__()
        self._tied: list[nn.Module] = []  # a plain list: the embedding is not a submodule here
        if node.tied_to is None:
            self.weight = nn.Parameter(torch.empty(node.vocab_size, node.dim))

    def tie(self, embedding: nn.Module) -> None:
        """Share ``embedding.weight`` (vocab, dim) from now on."""
        self._tied[:] = [embedding]

    def forward(self, x_bsd: torch.Tensor) -> torch.Tensor:
        weight = self._tied[0].weight if self._tied else self.weight
        return nn.functional.linear(x_bsd, weight)


_LOWERINGS: dict[type, Callable[[Any], nn.Module]] = {}


def register_lowering(node_type: type) -> Callable[[Callable[[Any], nn.Module]], Callable[[Any], nn.Module]]:
    """Decorator: ``build(node) -> nn.Module`` becomes the lowering rule for ``node_type``.

    Node families outside this module (vision, video, action heads) register their
    own rules, so :func:`lower_node` never needs to know them.

    Raises:
        ValueError: if ``node_type`` already has a rule.
    """
    def decorator(build: Callable[[Any], nn.Module]) -> Callable[[Any], nn.Module]:
        if node_type in _LOWERINGS:
            raise ValueError(f"{node_type.__name__} already has a lowering rule")
        _LOWERINGS[node_type] = build
        return build
    return decorator


def lower_node(node: _Node) -> nn.Module:
    """Build the module for one node (on the current default device) and tag it ``lf_node``.

    Raises:
        TypeError: for a node type without a lowering rule.
    """
    build = next((_LOWERINGS[t] for t in type(node).__mro__ if t in _LOWERINGS), None)
    if build is None:
        raise TypeError(f"node {node.name!r}: no lowering for {type(node).__name__}")
    module = build(node)
    module.lf_node = node
    return module


register_lowering(Embedding)(_lower_embedding)
register_lowering(Linear)(lambda node: nn.Linear(node.in_features, node.out_features, bias=node.bias))
register_lowering(PatchEmbed2D)(PatchEmbedModule)
register_lowering(LearnedPositional)(LearnedPositionalModule)
register_lowering(Norm)(_lower_norm)
register_lowering(Attention)(AttentionModule)
register_lowering(MLP)(MLPModule)
register_lowering(TransformerBlock)(TransformerBlockModule)
register_lowering(LMHead)(LMHeadModule)


class ComponentModule(nn.Module):
    """The lowered nodes of one component, applied in order.

    ``layers[i]`` is the module of ``component.nodes[i]``; ``blocks`` lists the
    transformer blocks (what recomputation and pipeline splitting work on).
    """

    def __init__(self, component: Component):
        super().__init__()
        self.lf_component = component
        self.layers = nn.ModuleList(lower_node(n) for n in component.nodes)
        self.index = {n.name: i for i, n in enumerate(component.nodes)}
        for node, module in zip(component.nodes, self.layers, strict=True):
            if isinstance(node, LMHead) and node.tied_to is not None:
                module.tie(self[node.tied_to])

    def __getitem__(self, name: str) -> nn.Module:
        return self.layers[self.index[name]]

    @property
    def blocks(self) -> list[nn.Module]:
        return [m for m in self.layers if isinstance(m, TransformerBlockModule)]

    def forward(self, x: torch.Tensor, *, mask: MaskSpec | None = None,
                key_padding: torch.Tensor | None = None, start: int = 0,
                stop: int | None = None, positions: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Apply ``layers[start:stop]``; blocks need ``mask`` (ValueError otherwise).

        ``positions`` (batch, seq) int64 are the rotary positions of the tokens
        (default ``0..seq-1``), used by attention nodes that carry a RoPE.
        ``document_ids`` (batch, seq) int keeps attention within packed documents.
        """
        docs = {} if document_ids is None else {"document_ids": document_ids}
        for layer in self.layers[start:stop]:
            if isinstance(layer, TransformerBlockModule):
                if mask is None:
                    raise ValueError(f"component {self.lf_component.name!r}: blocks need a mask")
                x = layer(x, mask, key_padding, positions, **docs)
            else:
                x = layer(x)
        return x


def lf_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module, _Node]]:
    """Yield (qualified name, module, IR node) for every lowered module in ``model``."""
    for name, module in model.named_modules():
        node = getattr(module, "lf_node", None)
        if node is not None:
            yield name, module, node


def init_weights(model: nn.Module, seed: int) -> nn.Module:
    """Deterministically initialize every parameter of ``model`` in place.

    Weights of linear, conv, embedding and positional tables ~ N(0, 0.02);
    biases 0; norm scales 1 (zero-centered ``1 + weight`` norms: weight 0). Each parameter's generator is seeded from
    ``seed`` and its qualified name, so results do not depend on build order.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            if getattr(owner, "zero_centered_gamma", False):
                param.zero_()  # scale 1 + weight: the identity at 0
            elif isinstance(owner, (nn.LayerNorm, nn.RMSNorm)):
                param.fill_(1.0 if leaf == "weight" else 0.0)
            elif leaf == "bias":
                param.zero_()
            else:
                gen = torch.Generator(device=param.device)
                gen.manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
                param.normal_(0.0, INIT_STD, generator=gen)
    return model


def materialize(model: nn.Module, device: torch.device | str, seed: int) -> nn.Module:
    """Move a meta-device model to ``device`` (uninitialized storage) and init it."""
    model.to_empty(device=device)
    return init_weights(model, seed)
