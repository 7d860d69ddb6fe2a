"""Recipe configs and lowered models of ``model.recipe``, read from lf-ir's recipe registry
(``lf_ir.recipe_spec``): built on the meta device and materialized."""

from __future__ import annotations

import typing

import msgspec


def recipe_config(recipe: str, size: str, overrides: dict):
    """(recipe config, IR graph) of ``model.recipe`` / ``model.size`` (any case: ``8b`` = ``8B``) /
    ``model.overrides``.

    Raises:
        ValueError: unknown recipe or size or override field (naming it), or a graph that does not validate.
    """
    from lf_ir import recipe_spec

    spec = recipe_spec(recipe, where="model.recipe")
    cls = spec.config_class
    cfg = cls(**{**spec.sizes[spec.size_name(size)], **recipe_overrides(cls, overrides, recipe)})
    return cfg, spec.build_graph(cfg)


class OverrideError(ValueError):
    """A ``model.overrides`` entry that the recipe config has no field for, or a value of another type; the
    message starts with the dotted key."""


def recipe_overrides(cls, overrides: dict, recipe: str) -> dict:
    """``model.overrides`` checked against the fields of the recipe config ``cls`` (a msgspec Struct) and
    converted to their types: a TOML array becomes the tuple a field holds (``mrope_section``), an integer a
    float field's float; a bool is not an integer.

    Raises:
        OverrideError: an unknown field (listing the recipe's fields), or a value the field's type does not
            take (``model.overrides.norm_eps: expected float, got 'x'``).
    """
    types = {f.name: f.type for f in msgspec.structs.fields(cls)}
    from lf_orchestrator._config_errors import did_you_mean

    bad = sorted(set(overrides) - set(types))
    if bad:
        hint = did_you_mean(bad[0], types)
        raise OverrideError(f"model.overrides: unknown field {bad[0]!r} for recipe {recipe!r}"
                            + (hint if hint.startswith("; did you mean") else f"; fields: {sorted(types)}"))
    out = {}
    for key, value in overrides.items():
        try:
            out[key] = msgspec.convert(value, types[key])
        except msgspec.ValidationError as err:
            if typing.get_origin(types[key]) is typing.Literal:  # an enum field: list what it takes
                expected = "expected one of " + ", ".join(repr(c) for c in typing.get_args(types[key]))
            else:
                expected = str(err).split(" - at")[0].split(", got")[0].replace("`", "").lower()
            raise OverrideError(f"model.overrides.{key}: {expected}, got {value!r}") from None
    return out


def build_model(recipe: str, rcfg, graph, device, seed: int, *, fused_ops: bool = False):
    """The lowered model built on ``meta`` and materialized on ``device`` with lf-ir's deterministic init.

    ``fused_ops`` (``model.fused_ops``): switch its modules to lf-kernels' fused ops (``lf_ir.use_fused_ops``);
    the weights are the same either way.
    """
    from lf_ir import materialize, recipe_spec, use_fused_ops

    model = materialize(recipe_spec(recipe, where="model.recipe").build_model(rcfg, graph), device, seed)
    if fused_ops:
        use_fused_ops(model)
    return model
