"""`lf ir show`: parameters, FLOPs and the per-component cost table of any recipe's IR graph."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from lf_orchestrator._console import make_console

ir_app = typer.Typer(help="Inspect model graphs of the unified IR.", no_args_is_help=True)
console = make_console(stderr=True)


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _recipe_module(recipe: str):
    from lf_ir.recipes import RECIPES

    if recipe not in RECIPES:
        raise ValueError(f"--recipe: unknown recipe {recipe!r}; expected one of {sorted(RECIPES)}")
    return RECIPES[recipe]


def missing_size(recipe: str) -> str:
    """The message for ``--recipe`` given without ``--size``: names the recipe's sizes (its ``SIZES``).

    Raises:
        ValueError: unknown recipe (lists the recipes).
    """
    sizes = sorted(getattr(_recipe_module(recipe), "SIZES", {}))
    example = "tiny" if "tiny" in sizes else sizes[0]
    return f"--size: missing; the {recipe} recipe's sizes are {sizes} (e.g. --recipe {recipe} --size {example})"


TYPICAL_TRAIN_SEQ = {"llama3": 8192}
"""Tokens per sample `lf ir show` uses by default, per recipe: the length the family is typically trained at
(Llama 3 pre-training: 8192, the context before long-context extension; arXiv 2407.21783 section 3.4), not the
model's maximum. Recipes not listed use their graph's own ``seq_len``."""


def default_seq(recipe: str, cfg: Any) -> tuple[Optional[int], str]:
    """(``--seq`` to use when none is given, a note saying where it comes from) for ``recipe``'s config ``cfg``.

    The typical training length of :data:`TYPICAL_TRAIN_SEQ`, capped at the model's ``max_seq_len``; None (the
    graph's ``seq_len``) for other recipes.
    """
    typical = TYPICAL_TRAIN_SEQ.get(recipe)
    longest = getattr(cfg, "max_seq_len", None)
    if typical is None:
        return None, "the recipe graph's sequence length"
    if longest is not None and longest < typical:
        return longest, f"the model's maximum length ({recipe}'s typical training length {typical:,} is longer)"
    limit = f"; the model allows up to {longest:,}" if longest is not None else ""
    return typical, f"{recipe}'s typical training length{limit}"


def build_recipe_graph(recipe: str, size: str, seq: Optional[int]):
    """(recipe config, IR graph, main component name) for any recipe of ``lf_ir.recipes.RECIPES``.

    The recipe module must offer ``<recipe>_config(size)`` (or ``config(size)``) and
    ``build_graph(cfg)``; ``seq`` is passed as ``build_graph(cfg, seq_len=seq)`` when
    ``build_graph`` takes ``seq_len``. The main component is the one with the most
    forward FLOPs: its ``seq_len`` is the "tokens per sample" FLOPs per token refer to.

    Raises:
        ValueError: unknown recipe or size, or ``seq`` for a recipe whose length is fixed.
    """
    import inspect

    from lf_ir import IRError, node_forward_flops

    module = _recipe_module(recipe)
    factory = getattr(module, f"{recipe}_config", None) or getattr(module, "config", None)
    if factory is None:
        raise ValueError(f"--recipe: recipe {recipe!r} has no {recipe}_config(size) factory")
    cfg = factory(size)
    takes_seq = "seq_len" in inspect.signature(module.build_graph).parameters
    if seq is not None and not takes_seq:
        raise ValueError(f"--seq: the {recipe} recipe's sequence length follows from its config")
    if seq is not None and seq <= 0:
        raise ValueError(f"--seq: must be a positive number of tokens, got {seq}")
    try:
        graph = module.build_graph(cfg, seq_len=seq) if seq is not None else module.build_graph(cfg)
    except IRError as err:
        raise ValueError(f"recipe {recipe} size {size}: {err}") from err
    main = max(graph.components, key=lambda c: sum(node_forward_flops(n, 1, c.seq_len) for n in c.nodes))
    return cfg, graph, main.name


@ir_app.command("show")
def show(recipe: Annotated[str, typer.Option(help="Recipe name (any of lf_ir.recipes.RECIPES).")],
         size: Annotated[Optional[str], typer.Option(help="Named size of the recipe, e.g. tiny, 1B, 8B, 70B, "
                                                         "small (without it, the error lists them).")] = None,
         seq: Annotated[Optional[int], typer.Option(help="Tokens per sample, for recipes whose "
                                                         "build_graph takes seq_len.")] = None,
         batch: Annotated[int, typer.Option(help="Samples per micro-batch for the table.")] = 1,
         dtype_bytes: Annotated[int, typer.Option(help="Bytes per activation element (2 bf16, 4 fp32).")] = 2,
         as_json: Annotated[bool, typer.Option("--json", help="Print the totals, the table and the graph "
                                                               "as JSON.")] = False):
    """Parameter count, FLOPs per token and per sample (fwd, fwd+bwd), and the per-component table."""
    import msgspec

    from lf_ir import cost_table, graph_cost, to_json

    if batch <= 0 or dtype_bytes <= 0:
        _fail(f"--batch and --dtype-bytes must be positive, got {batch} and {dtype_bytes}")
    seq_note = "--seq"
    try:
        if size is None:
            _fail(missing_size(recipe))
        if seq is None:
            cfg, _, _ = build_recipe_graph(recipe, size, None)
            seq, seq_note = default_seq(recipe, cfg)
        cfg, graph, main = build_recipe_graph(recipe, size, seq)
    except ValueError as err:
        _fail(str(err))
    per_sample = graph_cost(graph, batch=1, dtype_bytes=dtype_bytes)
    cost = per_sample if batch == 1 else graph_cost(graph, batch=batch, dtype_bytes=dtype_bytes)
    tokens = graph.component(main).seq_len
    fwd, bwd = per_sample.total("forward_flops"), per_sample.total("backward_flops")
    totals: dict[str, Any] = {
        "recipe": recipe, "size": size, "batch": batch, "dtype_bytes": dtype_bytes,
        "main_component": main, "tokens_per_sample": tokens, "tokens_per_sample_from": seq_note,
        "params": per_sample.total("params"),
        "forward_flops_per_sample": fwd, "train_flops_per_sample": fwd + bwd,
        "forward_flops_per_token": fwd / tokens, "train_flops_per_token": (fwd + bwd) / tokens,
        "forward_flops_unmasked_per_sample": per_sample.total("forward_flops_unmasked"),
        "saved_bytes_per_batch": cost.total("saved_bytes"),
    }
    if as_json:
        print(json.dumps({**totals, "components": msgspec.to_builtins(cost.components),
                          "config": msgspec.to_builtins(cfg), "graph": json.loads(to_json(graph))}))
        return
    print(f"{recipe} {size}: {totals['params']:,} parameters; {tokens:,} tokens per sample ({main!r})")
    if seq_note != "--seq":
        import inspect

        takes_seq = "seq_len" in inspect.signature(_recipe_module(recipe).build_graph).parameters
        print(f"tokens per sample: {tokens:,}, the default: {seq_note}"
              + (" (--seq to change)" if takes_seq else " (fixed by the recipe config)"))
    print(f"FLOPs per sample: forward {fwd:.4g}, forward + backward {fwd + bwd:.4g} (dense attention)")
    print(f"FLOPs per token:  forward {fwd / tokens:.4g}, forward + backward {(fwd + bwd) / tokens:.4g}")
    print(cost_table(cost))
