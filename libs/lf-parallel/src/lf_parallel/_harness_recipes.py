"""Fixed random batches and losses of the recipes the parallel harness can check.

The only place in lf-parallel that names recipes: it knows how to feed them, not
how to split them (that comes from the IR). Their configs, sizes, graphs and model
classes come from lf-ir's recipe registry (:func:`spec_model`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from lf_parallel import _harness_mm as mm

LLAMA_SEQ = 16
"""Tokens per sample of the llama3 harness batches (divisible by tp for sequence parallel)."""


@dataclasses.dataclass(frozen=True)
class HarnessRecipe:
    """How to build, feed and score one recipe."""

    build: Callable[[str], nn.Module]
    """size -> model built on the current default device (meta in the harness)."""
    batch: Callable[[nn.Module, int, int], dict]
    """(model, global_batch, seed) -> dict of tensors, dim 0 = sample."""
    loss: Callable[[nn.Module, dict], torch.Tensor]
    """(model, batch) -> mean loss over the batch's tokens (float32 scalar; a DTensor with vocab-parallel
    logits: call it inside ``loss_parallel_context``)."""
    cp_loss: Callable[[nn.Module, dict, object], torch.Tensor] | None = None
    """(model, batch, cp) -> this context-parallel rank's share of ``loss`` (the mean over the cp ranks equals
    ``loss`` on the whole sequence); ``cp`` is a :class:`lf_parallel._context.ContextParallel` and the model's
    attention is context-parallel. None: the recipe has no context-parallel feeding (plans with cp > 1 fail)."""


def spec_model(recipe: str, size: str, *, graph_kw: dict | None = None, edit_graph=None, model_class=None,
               **overrides) -> nn.Module:
    """The model of registered ``recipe`` (``lf_ir.recipe_spec``) at ``size`` (any case) with config
    ``overrides``, on the current default device (meta in the harness).

    ``graph_kw``: more ``build_graph`` arguments (the harness's sample length); ``edit_graph``: graph -> graph
    before lowering; ``model_class``: a subclass of the spec's model to build instead.

    Raises:
        ValueError: unknown recipe or size (naming the registered ones).
    """
    from lf_ir import recipe_spec

    spec = recipe_spec(recipe, where="--recipe")
    cfg = spec.config(spec.size_name(size, where="--size"), **overrides)
    graph = spec.build_graph(cfg, **(graph_kw or {}))
    if edit_graph is not None:
        graph = edit_graph(graph)
    return (model_class or spec.model)(cfg, graph)


def _llama_build(size: str) -> nn.Module:
    return spec_model("llama3", size)


def _vocab_parallel_embedding(graph):
    """``graph`` with its embedding tables row-split by tensor parallelism (``tp="row"``)."""
    import msgspec

    from lf_ir import Embedding

    text = graph.components[0]
    nodes = [msgspec.structs.replace(n, tp="row") if isinstance(n, Embedding) else n for n in text.nodes]
    return msgspec.structs.replace(graph, components=[msgspec.structs.replace(text, nodes=nodes)])


def _llama_vocab_parallel_build(size: str) -> nn.Module:
    """llama3 with a vocab-parallel (``tp="row"``) embedding table tied to the head."""
    return spec_model("llama3", size, edit_graph=_vocab_parallel_embedding, tie_embeddings=True)


def _llama_batch(model: nn.Module, batch: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"ids": torch.randint(0, model.cfg.vocab_size, (batch, LLAMA_SEQ), generator=gen)}


def _llama_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    from lf_ir.recipes.llama3 import next_token_loss

    ids = batch["ids"]
    return next_token_loss(model(ids), ids)


def llama_cp_loss(model: nn.Module, batch: dict, cp) -> torch.Tensor:
    """Next-token loss of this cp rank's zigzag shard: its tokens' summed cross-entropy times cp over all targets."""
    ids = batch["ids"]
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    logits = model(cp.shard(ids))
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), cp.shard(labels).reshape(-1),
                                       ignore_index=-100, reduction="sum")
    return loss * (cp.cp / labels[:, :-1].numel())


def _vla_build(size: str) -> nn.Module:
    return spec_model("vla", size)


def _vla_batch(model: nn.Module, batch: int, seed: int) -> dict:
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, cfg.max_instruction_len, dtype=torch.bool)
    lengths = torch.randint(1, cfg.max_instruction_len + 1, (batch,), generator=gen)
    mask &= torch.arange(cfg.max_instruction_len) < lengths[:, None]
    actions = torch.randint(cfg.text_vocab_size, cfg.vocab_size, (batch, cfg.num_action_tokens), generator=gen)
    return {"image": torch.randint(0, 256, (batch, cfg.image_size, cfg.image_size, 3), generator=gen,
                                   dtype=torch.uint8),
            "instruction_ids": torch.randint(0, cfg.text_vocab_size, (batch, cfg.max_instruction_len), generator=gen),
            "instruction_mask": mask,
            "state": torch.randn(batch, cfg.state_dim, generator=gen),
            "actions": actions}


def _ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _vla_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    actions = batch["actions"]
    logits = model(batch["image"], batch["instruction_ids"], batch["instruction_mask"], batch["state"],
                   actions[:, :-1])
    return _ce(logits, actions)


HARNESS_RECIPES: dict[str, HarnessRecipe] = {
    "llama3": HarnessRecipe(build=_llama_build, batch=_llama_batch, loss=_llama_loss, cp_loss=llama_cp_loss),
    "llama3_tied_vocab_parallel": HarnessRecipe(build=_llama_vocab_parallel_build, batch=_llama_batch,
                                                loss=_llama_loss),
    "vla": HarnessRecipe(build=_vla_build, batch=_vla_batch, loss=_vla_loss),
    "qwen2_vl": HarnessRecipe(build=mm.qwen2_vl_build, batch=mm.qwen2_vl_batch, loss=mm.qwen2_vl_loss),
    "wan_dit": HarnessRecipe(build=mm.wan_dit_build, batch=mm.wan_dit_batch, loss=mm.wan_dit_loss,
                             cp_loss=mm.wan_dit_cp_loss),
}
"""Recipe name -> how the harness builds and feeds it."""
