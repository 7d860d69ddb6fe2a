"""`lf ir show`: parameters, FLOPs and the per-component cost table of any recipe's IR graph."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from lf_orchestrator._console import fail, make_console

ir_app = typer.Typer(help="Inspect model graphs of the unified IR.", no_args_is_help=True)
console = make_console(stderr=True)


def _fail(message: str) -> None:
    fail(console, message)


def _recipe_spec(recipe: str):
    from lf_ir import recipe_spec

    return recipe_spec(recipe, where="--recipe")


def missing_size(recipe: str) -> str:
    """The message for ``--recipe`` given without ``--size``: names the recipe's sizes (its ``RecipeSpec.sizes``).

    Raises:
        ValueError: unknown recipe (lists the recipes).
    """
    spec = _recipe_spec(recipe)
    return (f"--size: missing; the {recipe} recipe's sizes are {sorted(spec.sizes)} "
            f"(e.g. --recipe {recipe} --size {spec.tiny})")


def default_seq(recipe: str, cfg: Any) -> tuple[Optional[int], str]:
    """(``--seq`` to use when none is given, a note saying where it comes from) for ``recipe``'s config ``cfg``.

    The recipe's typical training length (``lf_ir.RecipeSpec.train_seq_len``: Llama 3 pre-training's 8192, not
    the model's 131,072-token maximum), capped at the model's ``max_seq_len``; None (the graph's ``seq_len``)
    for recipes without one.
    """
    typical = _recipe_spec(recipe).train_seq_len
    longest = getattr(cfg, "max_seq_len", None)
    if typical is None:
        return None, "the recipe graph's sequence length"
    if longest is not None and longest < typical:
        return longest, f"the model's maximum length ({recipe}'s typical training length {typical:,} is longer)"
    limit = f"; the model allows up to {longest:,}" if longest is not None else ""
    return typical, f"{recipe}'s typical training length{limit}"


def build_recipe_graph(recipe: str, size: str, seq: Optional[int]):
    """(recipe config, IR graph, main component name) for any registered recipe (``lf_ir.recipe_spec``).

    ``size`` matches the recipe's sizes in any case; ``seq`` is passed as ``build_graph(cfg, seq_len=seq)`` when
    the recipe's ``build_graph`` takes ``seq_len``. The main component is the one with the most forward FLOPs:
    its ``seq_len`` is the "tokens per sample" FLOPs per token refer to.

    Raises:
        ValueError: unknown recipe or size, or ``seq`` for a recipe whose length is fixed.
    """
    from lf_ir import IRError, node_forward_flops

    spec = _recipe_spec(recipe)
    cfg = spec.config(spec.size_name(size, where="--size"))
    if seq is not None and not spec.takes_seq_len:
        raise ValueError(f"--seq: the {recipe} recipe's sequence length follows from its config")
    if seq is not None and seq <= 0:
        raise ValueError(f"--seq: must be a positive number of tokens, got {seq}")
    try:
        graph = spec.build_graph(cfg, seq_len=seq) if seq is not None else spec.build_graph(cfg)
    except IRError as err:
        raise ValueError(f"recipe {recipe} size {size}: {err}") from err
    main = max(graph.components, key=lambda c: sum(node_forward_flops(n, 1, c.seq_len) for n in c.nodes))
    return cfg, graph, main.name


@ir_app.command("show")
def show(recipe: Annotated[str, typer.Option(help="Recipe name (any registered in lf_ir.recipes, "
                                                          "e.g. llama3, qwen2_vl, wan_dit, vla).")],
         size: Annotated[Optional[str], typer.Option(help="Named size of the recipe (any case), e.g. tiny, "
                                                         "8B, small (without it, the error lists them).")] = None,
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
        size = _recipe_spec(recipe).size_name(size, where="--size")  # its registered spelling: 8b -> 8B
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
        takes_seq = _recipe_spec(recipe).takes_seq_len
        print(f"tokens per sample: {tokens:,}, the default: {seq_note}"
              + (" (--seq to change)" if takes_seq else " (fixed by the recipe config)"))
    print(f"FLOPs per sample: forward {fwd:.4g}, forward + backward {fwd + bwd:.4g} (dense attention)")
    print(f"FLOPs per token:  forward {fwd / tokens:.4g}, forward + backward {(fwd + bwd) / tokens:.4g}")
    print(cost_table(cost))
