"""LoRA adapters and freezing by name pattern, for every family.

LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", arXiv
2106.09685): a frozen ``nn.Linear`` W gets ``y = W x + (alpha / r) B A x`` with
A (r, in) Kaiming-uniform and B (out, r) zero, so training starts from the base
model exactly. Patterns are ``fnmatch`` globs over module / parameter names,
matched with and without the ``components.`` prefix lf-ir models carry
(``"vision.*"`` matches ``components.vision.layers.0.conv.weight``).
"""

from __future__ import annotations

import fnmatch
import math
import zlib

import torch
from torch import nn


def _names(name: str) -> tuple[str, ...]:
    return (name, name.removeprefix("components."))


def matches(name: str, patterns: list[str]) -> bool:
    """Whether ``name`` (or it without ``components.``) matches any fnmatch pattern."""
    return any(fnmatch.fnmatchcase(n, p) for n in _names(name) for p in patterns)


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) * x A^T B^T`` with ``base`` frozen; x (..., in) -> (..., out).

    Raises:
        ValueError: ``rank`` < 1.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, seed: int = 0):
        super().__init__()
        if rank < 1:
            raise ValueError(f"train.lora_rank must be >= 1 to wrap a linear, got {rank}")
        self.base, self.rank, self.scale = base, rank, alpha / rank
        for p in base.parameters():
            p.requires_grad_(False)
        w = base.weight
        gen = torch.Generator().manual_seed(seed)
        bound = 1 / math.sqrt(w.shape[1])  # kaiming_uniform_(a=sqrt(5)), as nn.Linear and the LoRA paper's code
        a = (torch.rand(rank, w.shape[1], generator=gen) * 2 - 1) * bound
        self.lora_a = nn.Parameter(a.to(device=w.device, dtype=w.dtype))
        self.lora_b = nn.Parameter(torch.zeros(w.shape[0], rank, device=w.device, dtype=w.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + nn.functional.linear(nn.functional.linear(x, self.lora_a), self.lora_b) * self.scale


def apply_lora(model: nn.Module, targets: list[str], rank: int, alpha: float, seed: int = 0) -> list[str]:
    """Freeze every parameter of ``model``, wrap the ``nn.Linear`` modules whose names match ``targets``.

    Returns:
        The wrapped module names, sorted.

    Raises:
        ValueError: no ``nn.Linear`` matches ``targets`` (naming the patterns and a few linear names).
    """
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    chosen = [(n, m) for n, m in linears if matches(n, targets)]
    if not chosen:
        raise ValueError(f"train.lora_targets: {targets} match no nn.Linear; linear modules are e.g. "
                         f"{[n for n, _ in linears[:4]]}")
    for p in model.parameters():
        p.requires_grad_(False)
    for name, linear in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(linear, rank, alpha, seed=zlib.crc32(f"{seed}:{name}".encode())))
    return sorted(n for n, _ in chosen)


def freeze(model: nn.Module, patterns: list[str]) -> list[str]:
    """Set ``requires_grad = False`` on the parameters whose names match ``patterns``; returns their names.

    Raises:
        ValueError: a pattern matches no parameter (naming it).
    """
    names = [n for n, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(matches(n, [pattern]) for n in names):
            raise ValueError(f"train.freeze: pattern {pattern!r} matches no parameter; names are e.g. {names[:3]}")
    frozen = []
    for name, p in model.named_parameters():
        if matches(name, patterns):
            p.requires_grad_(False)
            frozen.append(name)
    return frozen
