"""JSON Schema of run configs with field descriptions taken from the attribute docstrings (``lf config schema``)."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import textwrap
import types
import typing
from typing import Any

import msgspec


def attribute_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a class (the string literal right under each annotated field), by field name.

    Read once per class from its source with :mod:`ast` (Python keeps no such docstrings at run time); a class
    whose source cannot be read gives ``{}``.
    """
    return dict(_attribute_docs(cls))


@functools.cache
def _attribute_docs(cls: type) -> tuple[tuple[str, str], ...]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return ()
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = []
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs.append((node.target.id, inspect.cleandoc(after.value.value)))
    return tuple(docs)


def _struct_types(root: type) -> dict[str, type]:
    """Every msgspec struct reachable from ``root``'s fields, by class name (the schema's ``$defs`` keys)."""
    found: dict[str, type] = {}
    todo = [root]
    while todo:
        cls = todo.pop()
        if cls.__name__ in found:
            continue
        found[cls.__name__] = cls
        for tp in typing.get_type_hints(cls).values():
            for t in (tp, *typing.get_args(tp)):
                if isinstance(t, type) and issubclass(t, msgspec.Struct):
                    todo.append(t)
    return found


def field_choices(cls: type) -> dict[str, tuple[str, ...]]:
    """The accepted values of the fields of struct ``cls`` that a registry lists (a string field checked when the
    config loads, e.g. ``model.recipe``): its ``field_choices`` class attribute, field -> a function giving
    them, called now. ``{}`` for a struct without one."""
    return {field: tuple(get()) for field, get in getattr(cls, "field_choices", {}).items()}


def schema_with_docs(root: type) -> dict[str, Any]:
    """msgspec's JSON Schema of struct ``root`` with each field's attribute docstring as its ``description``.

    msgspec puts class docstrings into the schema but not attribute docstrings (Python does not keep them);
    they are read from the source with :func:`attribute_docs`. A struct-valued field without one (``Config``'s
    sections) is described by its struct's class docstring. A field of :func:`field_choices` gets its values as
    an ``enum``.
    """
    schema = msgspec.json.schema(root)
    structs = _struct_types(root)
    for name, definition in schema.get("$defs", {}).items():
        docs = attribute_docs(structs[name]) if name in structs else {}
        choices = field_choices(structs[name]) if name in structs else {}
        for field, prop in definition.get("properties", {}).items():
            if field in choices:
                prop["enum"] = list(choices[field])
            if field in docs:
                prop["description"] = docs[field]
            elif "$ref" in prop:  # a section of Config: its class docstring says what it holds
                section = structs.get(prop["$ref"].rsplit("/", 1)[-1])
                if section is not None and section.__doc__:
                    prop["description"] = inspect.cleandoc(section.__doc__)
    return schema


def _type_name(tp: Any) -> str:
    """A field type as the TOML user sees it: ``int``, ``array[str]``, ``'a' | 'b'`` (an enum's values)."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, dict):
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{'array' if origin is list else 'table'}[{args}]"
    return getattr(tp, "__name__", str(tp))


def describe_keys(root: type) -> list[tuple[str, str, str, str]]:
    """``(dotted key, type, default as JSON, description)`` for every field of every section of struct ``root``
    (``lf config schema --keys``), in the order the sections and fields are declared; the type of a field of
    :func:`field_choices` is its values (``'a' | 'b'``)."""
    rows = []
    for section in msgspec.structs.fields(root):
        struct = section.type
        docs, choices = attribute_docs(struct), field_choices(struct)
        defaults = msgspec.to_builtins(section.default)
        for field in msgspec.structs.fields(struct):
            default = json.dumps(defaults[field.name])
            kind = (" | ".join(repr(c) for c in choices[field.name]) if field.name in choices
                    else _type_name(field.type))
            rows.append((f"{section.name}.{field.name}", kind, default, docs.get(field.name, "")))
    return rows
