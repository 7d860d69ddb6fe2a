"""A config key that the recipe's family does not read is an error that names it, never silently ignored.

What each family reads is data beside the family sections (``families.sections.FAMILY_READS``). Only the keys the
user wrote count (the TOML tree after ``--set``): a section left out keeps its defaults and is never an error.
What lf writes itself, the run folder's ``config.toml`` (``config.to_toml``), holds only the sections the family
reads, so ``lf run --resume``, ``lf eval`` and ``lf sample`` load it as it is.
"""

from __future__ import annotations

from typing import Any

from lf_orchestrator._config_errors import ConfigError
from lf_orchestrator.families.sections import ALL_KEYS, FAMILY_READS, UNREAD_WHY, family_reads


def recipe_family(recipe: str) -> str | None:
    """The family of ``model.recipe`` (lf-ir's ``RecipeSpec.family``), or None for a recipe the registry lacks
    (the model check names it)."""
    from lf_ir import recipe_spec

    try:
        return recipe_spec(recipe).family
    except ValueError:
        return None


def _reads_text(reads: dict[str, tuple[str, ...] | None]) -> str:
    return ", ".join(f"[{s}]" if keys is ALL_KEYS else f"[{s}] ({', '.join(keys)})" for s, keys in reads.items())


def _readers(section: str, key: str, recipes: list[str]) -> list[str]:
    """The recipes whose family reads ``section.key``."""
    out = []
    for recipe in recipes:
        keys = family_reads(recipe_family(recipe)).get(section, ())
        if keys is ALL_KEYS or key in keys:
            out.append(recipe)
    return out


def drop_unread(tree: dict[str, Any], recipe: str, known: dict[str, set[str]]) -> dict[str, Any]:
    """``tree`` without the config keys ``recipe``'s family does not read: for a run folder's own ``config.toml``,
    which lf-orchestrator before 0.10 wrote with every section (a user's file is refused instead,
    :func:`check_unread`). Only keys of the config (``known``: section -> its keys) are dropped: a misspelled
    section or key stays, for the decoder to name. An unregistered recipe or family: ``tree`` unchanged (the
    model check names it)."""
    family = recipe_family(recipe) if isinstance(recipe, str) else None
    if family not in FAMILY_READS:
        return tree
    reads = family_reads(family)
    out: dict[str, Any] = {}
    for section, table in tree.items():
        keys = reads.get(section, ())
        if keys is ALL_KEYS or not isinstance(table, dict) or section not in known:
            out[section] = table
            continue
        kept = {k: v for k, v in table.items() if k in keys or k not in known[section]}
        if kept or keys:
            out[section] = kept
    return out


def check_unread(tree: dict[str, Any], recipe: str, where: str) -> None:
    """Refuse the first key of ``tree`` (the TOML file's tables after ``--set``) that ``recipe``'s family does not
    read, naming the registered recipes that do read it. Keys of sections the config does not have are left to
    the decoder (it names them as unknown); an unregistered recipe to the model check.

    Raises:
        ConfigError: ``{where}: section.key: model.recipe = 'R' (family F) does not read it (why); the F family
            reads [run], [model], ... Remove it (recipes that read it: ...)``; ``[section]`` instead of ``it``
            when the family reads none of the section.
    """
    family = recipe_family(recipe)
    if family is None:
        return
    from lf_ir import recipe_names

    recipes = list(recipe_names())
    if family not in FAMILY_READS:  # a family lf run does not train: the model check refuses the recipe by name
        return
    reads = family_reads(family)
    for section, table in tree.items():
        keys = reads.get(section, ())
        if keys is ALL_KEYS or not isinstance(table, dict):
            continue
        for key in table:
            if key in keys:
                continue
            why = UNREAD_WHY.get((family, section))
            others = [r for r in _readers(section, key, recipes) if r != recipe]
            raise ConfigError(
                f"{where}: {section}.{key}: model.recipe = {recipe!r} (family {family}) does not read "
                + ("it" if keys else f"[{section}]") + (f" ({why})" if why else "")
                + f"; the {family} family reads {_reads_text(reads)}. Remove it"
                + (f" (recipes that read it: {', '.join(others)})" if others else ""))
