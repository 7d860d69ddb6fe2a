"""What a recipe is, in one record (:class:`RecipeSpec`), and the registry of them.

Every table that says what a recipe is (the orchestrator's config check, ``lf ir show``, ``lf plan``,
``lf convert``, the trainer's plan checks, lf-parallel's harness) reads it from here. A recipe registers
itself at the end of its own module with :func:`register_recipe`; ``lf_ir.recipes`` imports every
recipe module, so the registry is full once ``lf_ir`` is imported. Adding a model is its own module plus
one import line in ``lf_ir/recipes/__init__.py``.

This module imports neither torch nor the recipes (a spec holds their classes and functions).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, get_args

from lf_ir._mask import MaskKind

__all__ = ["RECIPES", "RecipeSpec", "lazy_function", "recipe_names", "recipe_spec", "register_recipe"]

CP_KINDS = ("ring", "ulysses")
"""Context-parallel kinds a recipe can declare in :attr:`RecipeSpec.context_parallel`."""


class _LazyFunction:
    """A function of another module imported on the first call (for converters whose module imports the
    recipe module that names them)."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def resolve(self) -> Callable[..., Any]:
        """The function itself (imports its module)."""
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _LazyFunction) and (self.module, self.name) == (other.module, other.name)

    def __hash__(self) -> int:
        return hash((self.module, self.name))


def lazy_function(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported when first called: ``lazy_function("lf_ir.interop", "import_hf_llama")``.

    The converters of :mod:`lf_ir.interop` import their recipe module, so a recipe names them this way.
    ``.resolve()`` returns the function itself.
    """
    return _LazyFunction(module, name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecipeSpec:
    """What a recipe is: its config, sizes, graph, model, converters, test size, masks and parallelisms.

    Example:
        >>> from lf_ir.recipes import recipe_spec
        >>> spec = recipe_spec("llama3")
        >>> spec.config("8b").dim, spec.size_name("8b"), spec.family
        (4096, '8B', 'llm')
        >>> spec.build_graph(spec.config(spec.tiny)).recipe
        'llama3'
    """

    name: str
    """Registry key and ``model.recipe`` value, e.g. ``"llama3"``: lower case, no spaces."""
    family: str
    """The lf-orchestrator family that trains it: ``"llm"``, ``"vlm"``, ``"video"``, ``"video_vae"``, ``"vla"``
    or ``"vla_flow"`` (a name only; lf-ir does not import the orchestrator)."""
    config_class: type
    """The recipe config, a frozen msgspec Struct; a size's entry of :attr:`sizes` are overrides of its
    defaults, ``model.overrides`` are checked against its fields."""
    sizes: Mapping[str, Mapping[str, Any]]
    """Named sizes (``"8B"``, ``"tiny"``...) -> overrides of the config defaults. Looked up case-insensitively
    (:meth:`size_name`), so no two names may differ only in case."""
    build_graph: Callable[..., Any]
    """``build_graph(config, **kw) -> lf_ir.Graph``, validated. Its keyword arguments are the recipe's
    (``seq_len`` for the sequence models, ``frames`` / ``height`` / ``width`` for the VAE...)."""
    model: Callable[..., Any]
    """The lowered model class (or a builder): ``model(config, graph) -> torch.nn.Module``, built on the meta
    device and materialized by ``lf_ir.materialize``; ``graph=None`` builds the recipe's default graph."""
    tiny: str = "tiny"
    """The size used for parity, parallel and CI checks: a few layers, built in milliseconds on the CPU."""
    import_hf: Callable[..., Any] | None = None
    """``import_hf(src folder) -> (config, state dict under lf names)`` from a Hugging Face ``transformers`` /
    ``diffusers`` folder (a function of :mod:`lf_ir.interop`); None: ``lf convert`` does not take it."""
    export_hf: Callable[..., Any] | None = None
    """``export_hf(model, dst folder) -> Path``: the peer's ``save_pretrained`` folder; None: no export."""
    masks: tuple[MaskKind, ...] = ()
    """Attention mask kinds its graph uses (:data:`lf_ir.MaskKind`), e.g. ``("full", "causal")`` for a VLM
    (bidirectional vision encoder, causal decoder); () for a model without attention."""
    tensor_parallel: bool = False
    """Its graph annotates tensor-parallel splits (``tp > 1`` shards its linears and heads)."""
    sequence_parallel: bool = False
    """Sequence parallelism (``sp`` with ``tp > 1``) runs on it: its token-wise nodes take split sequences."""
    context_parallel: tuple[str, ...] = ()
    """Context-parallel kinds (``cp > 1``; of ``"ring"``, ``"ulysses"``) its model and loss split the
    sequence for in ``lf run``; () none."""
    pipeline: bool = False
    """Pipeline parallelism (``pp > 1``) runs on it in ``lf run``'s trainer."""
    train_seq_len: int | None = None
    """Tokens per sample it is typically trained at (``lf ir show`` / ``lf plan`` default ``--seq``, capped at
    the config's ``max_seq_len``); None: the graph's own length."""

    def __post_init__(self) -> None:
        where = f"recipe {self.name!r}"
        if not self.name or self.name != self.name.strip().lower() or " " in self.name:
            raise ValueError(f"{where}: name: expected a non-empty lower-case name without spaces")
        if not self.family:
            raise ValueError(f"{where}: family: expected the orchestrator family name, got {self.family!r}")
        folded: dict[str, str] = {}
        for size in self.sizes:
            if size.lower() in folded:
                raise ValueError(f"{where}: sizes: {folded[size.lower()]!r} and {size!r} differ only in case")
            folded[size.lower()] = size
        if self.tiny not in self.sizes:
            raise ValueError(f"{where}: tiny: expected one of its sizes {sorted(self.sizes)}, got {self.tiny!r}")
        bad = [m for m in self.masks if m not in get_args(MaskKind)]
        if bad:
            raise ValueError(f"{where}: masks: expected kinds of {list(get_args(MaskKind))}, got {bad[0]!r}")
        bad = [k for k in self.context_parallel if k not in CP_KINDS]
        if bad:
            raise ValueError(f"{where}: context_parallel: expected kinds of {list(CP_KINDS)}, got {bad[0]!r}")
        if self.sequence_parallel and not self.tensor_parallel:
            raise ValueError(f"{where}: sequence_parallel needs tensor_parallel (sp splits the tp group)")
        object.__setattr__(self, "sizes", MappingProxyType(dict(self.sizes)))

    def size_name(self, size: str, *, where: str = "model.size") -> str:
        """The registered spelling of ``size``, matched case-insensitively (``"8b"`` -> ``"8B"``).

        Raises:
            ValueError: ``{where}: unknown {recipe} size ...; expected one of [...]`` naming the sizes.
        """
        for name in self.sizes:
            if name.lower() == str(size).lower():
                return name
        raise ValueError(f"{where}: unknown {self.name} size {size!r}; expected one of {sorted(self.sizes)} "
                         f"(any case)")

    def config(self, size: str, **overrides: Any) -> Any:
        """The config of a named size (any case) with field overrides.

        Raises:
            ValueError: unknown size (lists the sizes); TypeError: an override the config has no field for.
        """
        return self.config_class(**{**self.sizes[self.size_name(size)], **overrides})

    def build_model(self, config: Any, graph: Any = None) -> Any:
        """``model(config, graph)`` built on the meta device (no memory): materialize it with
        ``lf_ir.materialize(model, device, seed)``. ``graph=None``: the recipe's default graph."""
        import torch

        with torch.device("meta"):
            return self.model(config, graph)

    @property
    def takes_seq_len(self) -> bool:
        """Whether :attr:`build_graph` takes ``seq_len`` (tokens per sample of its main component)."""
        return "seq_len" in inspect.signature(self.build_graph).parameters


_REGISTRY: dict[str, RecipeSpec] = {}

RECIPES: Mapping[str, RecipeSpec] = MappingProxyType(_REGISTRY)
"""Recipe name -> :class:`RecipeSpec`, read-only; fill it with :func:`register_recipe`."""


def register_recipe(spec: RecipeSpec) -> RecipeSpec:
    """Add ``spec`` to the registry under ``spec.name`` and return it.

    Raises:
        ValueError: a recipe of that name is registered already.
    """
    if not isinstance(spec, RecipeSpec):
        raise TypeError(f"register_recipe: expected a RecipeSpec, got {type(spec).__name__}")
    if spec.name in _REGISTRY:
        raise ValueError(f"register_recipe: a recipe named {spec.name!r} is registered already "
                         f"(family {_REGISTRY[spec.name].family!r}); pick another name")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_recipe(name: str) -> RecipeSpec:
    """Remove the recipe ``name`` from the registry and return its spec (a recipe registered for a test, or one a
    user replaces with their own definition).

    Raises:
        ValueError: no recipe of that name is registered (the message lists the registered ones).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unregister_recipe: no recipe named {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY.pop(name)


def recipe_names() -> tuple[str, ...]:
    """The registered recipe names, sorted."""
    return tuple(sorted(_REGISTRY))


def recipe_spec(name: str, *, where: str = "recipe") -> RecipeSpec:
    """The :class:`RecipeSpec` registered as ``name``.

    Raises:
        ValueError: ``{where}: unknown recipe 'x'; expected one of ...; did you mean 'y'?``, listing the
            registered names and, when one is close, the closest.
    """
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    names = recipe_names()
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"{where}: unknown recipe {name!r}; expected one of {', '.join(names)}{hint}")
