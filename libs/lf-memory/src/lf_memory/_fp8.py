"""FP8 linear layers for training through torchao's float8 (tensorwise or rowwise scaling).

``torchao.float8.convert_to_float8_training`` swaps ``nn.Linear`` modules for
``Float8Linear``: inputs, weights and output gradients are cast to float8 (e4m3)
with dynamic scales and the three GEMMs of each linear run on FP8 tensor cores
(Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv 2209.05433;
torchao's recipes: ``"tensorwise"``, one scale per tensor, cuBLAS, fastest;
``"rowwise"``, one scale per row, CUTLASS, more accurate). Needs a GPU with FP8
tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell).

Which layers: casting costs memory traffic linear in the tensor sizes while the
GEMM saving grows with ``M * K * N``, so small GEMMs get slower in FP8. The
filter (:func:`fp8_filter`) keeps a linear in bf16 unless both its feature
sizes are multiples of 16 (an FP8 GEMM requirement) and at least
``min_features``, and the GEMM of a micro-batch (``tokens`` rows) reaches
``min_gemm_flops``; named layers (the LM head by default, for accuracy, as
torchtitan does) are skipped. torchao is optional: it is imported only when
:func:`apply_fp8` runs, with an error that says how to install it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

import torch
from torch import nn

__all__ = ["FP8_RECIPES", "apply_fp8", "fp8_filter", "fp8_linear_names", "fp8_supported"]

FP8_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise")
"""torchao ``Float8LinearRecipeName`` values this module accepts."""

_MIN_CAPABILITY = (8, 9)


def fp8_filter(
    *, min_features: int = 1024, tokens: int | None = None, min_gemm_flops: float = 2 * 4096 * 1024 * 1024,
    skip: Sequence[str] = ("head", "lm_head", "output"),
) -> Callable[[nn.Module, str], bool]:
    """A ``module_filter_fn(module, fqn) -> bool`` for torchao: which linears become FP8.

    Args:
        min_features: smallest ``in_features`` and ``out_features`` converted.
        tokens: rows ``M`` of the forward GEMM per micro-batch (batch * seq on this rank); None skips
            the GEMM-size rule.
        min_gemm_flops: with ``tokens``, smallest ``2 * M * K * N`` converted (default: a 4096-token
            micro-batch through a 1024 x 1024 layer).
        skip: fully qualified names whose last component is in this list stay in bf16.

    Returns:
        The filter. Non-``nn.Linear`` modules return True (torchao swaps only linears; its own example
        does the same).

    Example:
        >>> keep = fp8_filter(min_features=64)
        >>> keep(nn.Linear(64, 128), "blocks.0.mlp.up"), keep(nn.Linear(64, 40), "x"), keep(nn.Linear(64, 64), "head")
        (True, False, False)
    """
    if min_features < 1:
        raise ValueError(f"min_features must be >= 1, got {min_features}")
    if tokens is not None and tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    skipped = frozenset(skip)

    def keep(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear):
            return True
        k, n = module.in_features, module.out_features
        if fqn.rsplit(".", 1)[-1] in skipped or k % 16 or n % 16 or min(k, n) < min_features:
            return False
        return tokens is None or 2 * tokens * k * n >= min_gemm_flops

    return keep


def fp8_linear_names(model: nn.Module, module_filter: Callable[[nn.Module, str], bool]) -> list[str]:
    """Fully qualified names of the ``nn.Linear`` modules ``module_filter`` would convert (CPU-safe)."""
    return [name for name, mod in model.named_modules() if isinstance(mod, nn.Linear) and module_filter(mod, name)]


def fp8_supported(device: torch.device | str) -> bool:
    """Whether ``device`` is a CUDA GPU with FP8 tensor cores (compute capability 8.9 or newer)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available() and \
        torch.cuda.get_device_capability(device) >= _MIN_CAPABILITY


def apply_fp8(
    model: nn.Module, recipe: str = "tensorwise", *, module_filter: Callable[[nn.Module, str], bool] | None = None,
    device: torch.device | str | None = None,
) -> list[str]:
    """Swap the chosen ``nn.Linear`` layers of ``model`` for torchao ``Float8Linear``, in place.

    Apply after tensor parallelism and before ``torch.compile`` / FSDP (torchao's order). Parameter
    names and ``state_dict`` keys do not change (``Float8Linear`` subclasses ``nn.Linear``).

    Args:
        model: the model, on the GPU, parameters float32 or bf16.
        recipe: one of :data:`FP8_RECIPES`.
        module_filter: which linears (default :func:`fp8_filter` with its defaults).
        device: where it will run (default: the device of the first parameter); must support FP8.

    Returns:
        The names of the converted linears.

    Raises:
        ValueError: unknown ``recipe``, or a device without FP8 tensor cores (names it and its capability).
        ImportError: torchao is not installed (says which package to install).
    """
    if recipe not in FP8_RECIPES:
        raise ValueError(f"memory.fp8 recipe must be one of {list(FP8_RECIPES)}, got {recipe!r}")
    if device is None:
        device = next(model.parameters()).device
    if not fp8_supported(device):
        capability = torch.cuda.get_device_capability(device) if torch.device(device).type == "cuda" else None
        raise ValueError(f"FP8 training needs a CUDA GPU of compute capability >= 8.9; got device {str(device)!r}"
                         + (f" with capability {capability}" if capability else ""))
    try:
        float8 = importlib.import_module("torchao.float8")
    except ImportError as err:
        raise ImportError("FP8 training needs torchao (pip install 'lf-memory[fp8]', or a torchao wheel built "
                          f"for torch {torch.__version__}): {err}") from None
    keep = module_filter or fp8_filter()
    names = fp8_linear_names(model, keep)
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    float8.convert_to_float8_training(model, config=config, module_filter_fn=keep)
    return names
