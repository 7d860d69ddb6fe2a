"""`lf convert import-hf|export-hf`: checkpoints between lf and the peers users know.

An lf model folder holds ``model.json`` (recipe and recipe config) and
``model.safetensors`` (weights under lf's names). Peer folders are what
``save_pretrained`` writes: ``config.json`` plus safetensors, from HF
``transformers`` (Llama 3, Qwen2-VL) or ``diffusers`` (Wan2.1 DiT and VAE). The
converters live in ``lf_ir.interop``; this module only reads and writes folders.
No pickle is ever read; the lf folder is written atomically file by file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from lf_orchestrator._console import fail, make_console

convert_app = typer.Typer(help="Convert checkpoints between lf and Hugging Face (transformers, diffusers) formats.",
                          no_args_is_help=True)
console = make_console(stderr=True)


def converters() -> dict[str, object]:
    """Recipe -> its :class:`lf_ir.RecipeSpec`, for the registered recipes that have HF / diffusers converters
    (``import_hf`` and ``export_hf``, functions of ``lf_ir.interop``)."""
    from lf_ir import RECIPES

    return {name: spec for name, spec in sorted(RECIPES.items()) if spec.import_hf and spec.export_hf}


def _fail(message: str) -> None:
    fail(console, message)


def _check_recipe(recipe: object, where: str):
    """The spec of ``recipe``; exit 2 naming ``where`` and the recipes with converters when it has none."""
    available = converters()
    if not isinstance(recipe, str) or recipe not in available:
        _fail(f"{where}: no converter for {recipe!r}; available: {list(available)}")
    return available[recipe]


@convert_app.command("import-hf")
def import_hf(src: Annotated[Path, typer.Argument(help="Peer model folder (config.json + safetensors).")],
              dst: Annotated[Path, typer.Argument(help="lf model folder to write.")],
              recipe: Annotated[str, typer.Option(help="Recipe of the model: a registered recipe with "
                                                  "HF / diffusers converters (a wrong one lists them).")] = "llama3"):
    """Read a transformers / diffusers checkpoint into an lf model folder (model.json + model.safetensors)."""
    recipe_spec = _check_recipe(recipe, "--recipe")
    if not (src / "config.json").is_file():
        _fail(f"{src}: not a Hugging Face model folder (no config.json)")
    import msgspec
    from safetensors.torch import save_file

    from lf_orchestrator._atomic import atomic_path, write_text_atomic

    try:
        cfg, state = recipe_spec.import_hf(src)
    except (ValueError, KeyError, FileNotFoundError) as err:
        _fail(f"{src}: {err}")
    dst.mkdir(parents=True, exist_ok=True)
    with atomic_path(dst / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
    write_text_atomic(dst / "model.json", json.dumps(
        {"recipe": recipe, "config": msgspec.to_builtins(cfg)}, indent=1))
    console.print(f"wrote {dst} ({sum(v.numel() for v in state.values()):,} parameters)")


@convert_app.command("export-hf")
def export_hf(src: Annotated[Path, typer.Argument(help="lf model folder (model.json + model.safetensors).")],
              dst: Annotated[Path, typer.Argument(help="Peer model folder to write.")]):
    """Write an lf model folder as a checkpoint that the peer's `from_pretrained` loads."""
    if not (src / "model.json").is_file() or not (src / "model.safetensors").is_file():
        _fail(f"{src}: not an lf model folder (needs model.json and model.safetensors)")
    spec = json.loads((src / "model.json").read_text())
    recipe = spec.get("recipe")
    recipe_spec = _check_recipe(recipe, f"{src / 'model.json'}: recipe")
    import msgspec
    from safetensors.torch import load_file

    try:
        cfg = msgspec.convert(spec["config"], recipe_spec.config_class)
    except (msgspec.ValidationError, KeyError) as err:
        _fail(f"{src / 'model.json'}: config: {err}")
    model = recipe_spec.build_model(cfg)
    try:
        state = load_file(str(src / "model.safetensors"))
    except Exception as err:  # safetensors raises its own error types for files of another format
        _fail(f"{src / 'model.safetensors'}: not a safetensors file ({err})")
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as err:
        _fail(f"{src / 'model.safetensors'}: weights do not fit the {recipe} config in model.json: {err}")
    recipe_spec.export_hf(model, dst)
    console.print(f"wrote {dst}")
