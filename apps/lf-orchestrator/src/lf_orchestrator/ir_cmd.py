"""`lf ir show` and `lf convert import-hf|export-hf`: the IR and checkpoint interop on the command line.

An lf model folder holds ``model.json`` (recipe and recipe config) and
``model.safetensors`` (weights under lf's names); HF folders hold ``config.json``
and safetensors as ``save_pretrained`` writes them. No pickle is ever read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

ir_app = typer.Typer(help="Inspect model graphs of the unified IR.", no_args_is_help=True)
convert_app = typer.Typer(help="Convert checkpoints between lf and Hugging Face formats.",
                          no_args_is_help=True)
console = Console(stderr=True)
CONVERTIBLE = ("llama3",)


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def build_recipe_graph(recipe: str, size: str, seq: Optional[int]):
    """(recipe config, IR graph, tokens per sample) for a named recipe and size.

    Raises:
        ValueError: unknown recipe or size, or ``seq`` for a recipe whose length is fixed.
    """
    from lf_ir.recipes import llama3, vla

    if recipe == "llama3":
        cfg = llama3.llama3_config(size)
        graph = llama3.build_graph(cfg, seq)
        return cfg, graph, seq or cfg.max_seq_len
    if recipe == "vla":
        if seq is not None:
            raise ValueError("--seq: the vla recipe's sequence length follows from its config")
        cfg = vla.vla_config(size)
        return cfg, vla.build_graph(cfg), cfg.seq_len
    raise ValueError(f"--recipe: unknown recipe {recipe!r}; expected one of ['llama3', 'vla']")


@ir_app.command("show")
def show(recipe: Annotated[str, typer.Option(help="Recipe name: llama3 or vla.")],
         size: Annotated[str, typer.Option(help="Named size, e.g. tiny, 1B, 8B, 70B, small.")],
         seq: Annotated[Optional[int], typer.Option(help="Tokens per sample (llama3).")] = None,
         as_json: Annotated[bool, typer.Option("--json", help="Print the graph and totals as JSON.")] = False):
    """Parameter count, FLOPs per token and per sample, and the per-component table."""
    import msgspec

    from lf_ir import forward_flops, param_count, summary_rows, to_json

    try:
        cfg, graph, tokens = build_recipe_graph(recipe, size, seq)
    except ValueError as err:
        _fail(str(err))
    params, fwd = param_count(graph), forward_flops(graph, batch=1)
    totals: dict[str, Any] = {"recipe": recipe, "size": size, "tokens_per_sample": tokens,
                              "params": params, "forward_flops_per_sample": fwd,
                              "train_flops_per_sample": 3 * fwd,
                              "train_flops_per_token": 3 * fwd / tokens}
    if as_json:
        print(json.dumps({**totals, "config": msgspec.to_builtins(cfg),
                          "graph": json.loads(to_json(graph))}))
        return
    table = Table(title=f"{recipe} {size}: {params:,} parameters, {tokens:,} tokens per sample")
    for col in ("component", "modality", "seq", "params", "fwd FLOPs / sample"):
        table.add_column(col, justify="left" if col in ("component", "modality") else "right")
    for name, modality, comp_seq, comp_params, flops in summary_rows(graph):
        table.add_row(name, modality, f"{comp_seq:,}", f"{comp_params:,}", f"{flops:.4g}")
    Console().print(table)
    print(f"training FLOPs per token (forward + backward, dense attention): "
          f"{totals['train_flops_per_token']:.4g}")


@convert_app.command("import-hf")
def import_hf(src: Annotated[Path, typer.Argument(help="HF model folder (config.json + safetensors).")],
              dst: Annotated[Path, typer.Argument(help="lf model folder to write.")],
              recipe: Annotated[str, typer.Option(help="Recipe of the model.")] = "llama3"):
    """Read an HF checkpoint into an lf model folder (model.json + model.safetensors)."""
    if recipe not in CONVERTIBLE:
        _fail(f"--recipe: no HF converter for {recipe!r}; available: {list(CONVERTIBLE)}")
    if not (src / "config.json").is_file():
        _fail(f"{src}: not an HF model folder (no config.json)")
    import msgspec
    from safetensors.torch import save_file

    from lf_ir.interop import import_hf_llama
    from lf_orchestrator.checkpoint import write_text_atomic

    try:
        cfg, state = import_hf_llama(src)
    except (ValueError, KeyError, FileNotFoundError) as err:
        _fail(f"{src}: {err}")
    dst.mkdir(parents=True, exist_ok=True)
    tmp = dst / ".model.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
    tmp.replace(dst / "model.safetensors")
    write_text_atomic(dst / "model.json", json.dumps(
        {"recipe": recipe, "config": msgspec.to_builtins(cfg)}, indent=1))
    console.print(f"wrote {dst} ({sum(v.numel() for v in state.values()):,} parameters)")


@convert_app.command("export-hf")
def export_hf(src: Annotated[Path, typer.Argument(help="lf model folder (model.json + model.safetensors).")],
              dst: Annotated[Path, typer.Argument(help="HF model folder to write.")]):
    """Write an lf model folder as an HF checkpoint that `from_pretrained` loads."""
    if not (src / "model.json").is_file() or not (src / "model.safetensors").is_file():
        _fail(f"{src}: not an lf model folder (needs model.json and model.safetensors)")
    spec = json.loads((src / "model.json").read_text())
    if spec.get("recipe") not in CONVERTIBLE:
        _fail(f"{src / 'model.json'}: recipe: no HF converter for {spec.get('recipe')!r}; "
              f"available: {list(CONVERTIBLE)}")
    import msgspec
    import torch
    from safetensors.torch import load_file

    from lf_ir.interop import export_hf_llama
    from lf_ir.recipes.llama3 import Llama3Config, Llama3Model

    try:
        cfg = msgspec.convert(spec["config"], Llama3Config)
    except (msgspec.ValidationError, KeyError) as err:
        _fail(f"{src / 'model.json'}: config: {err}")
    with torch.device("meta"):
        model = Llama3Model(cfg)
    model.load_state_dict(load_file(str(src / "model.safetensors")), strict=True, assign=True)
    export_hf_llama(model, dst)
    console.print(f"wrote {dst}")
