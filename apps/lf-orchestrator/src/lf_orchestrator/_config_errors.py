"""Config errors: msgspec's validation messages rewritten as one line that names the file and the dotted key; and
the notes about values lf adjusts (:func:`fit_warmup`)."""

from __future__ import annotations

import difflib
import os
import re
import sys
import typing
from typing import Any, Literal

import msgspec


class ConfigError(ValueError):
    """A config that cannot run; the message names the file and the dotted key."""


_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`(?: - at `\$\.?(?P<at>[^`]*)`)?")
_AT = re.compile(r"(?P<msg>.*?)(?: - at `\$\.?(?P<at>[^`]*)`)?$")


_ENUM = re.compile(r"Invalid enum value (?P<value>.+?) - at `\$\.(?P<at>[^`]+)`")


def literal_choices(root: type, key: str) -> tuple[Any, ...] | None:
    """The accepted values of the ``Literal`` field at dotted ``key`` (e.g. ``memory.recompute``) of msgspec struct
    ``root``, or None when ``key`` is not such a field."""
    tp: Any = root
    for part in key.split("."):
        if not (isinstance(tp, type) and issubclass(tp, msgspec.Struct)):
            return None
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return None
        tp = hints[part]
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def struct_at(root: type, path: str) -> type | None:
    """The msgspec struct at dotted ``path`` of struct ``root`` (``""``: ``root`` itself), or None when ``path``
    does not lead to a struct."""
    tp: Any = root
    for part in filter(None, path.split(".")):
        if not (isinstance(tp, type) and issubclass(tp, msgspec.Struct)):
            return None
        tp = typing.get_type_hints(tp).get(part)
    return tp if isinstance(tp, type) and issubclass(tp, msgspec.Struct) else None


def did_you_mean(name: str, valid: typing.Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` naming the closest of ``valid`` to the misspelled ``name``
    (:func:`difflib.get_close_matches`), else ``"; expected one of ..."`` listing ``valid`` (sorted)."""
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return "; expected one of " + ", ".join(repr(v) for v in valid)


def unknown_key(root: type, at: str, field: str) -> str:
    """``unknown key 'train.stepz'; did you mean 'train.steps'?``: the dotted key of the unknown ``field`` of the
    table at ``at`` and the closest field of ``root``'s struct there (the section names at the top level), or the
    fields it has when none is close."""
    key = ".".join(p for p in (at, field) if p)
    struct = struct_at(root, at)
    hint = did_you_mean(field, struct.__struct_fields__) if struct is not None else ""
    if hint.startswith("; did you mean") and at:  # the full dotted key, as it is written in --set
        hint = hint.replace("mean '", f"mean '{at}.", 1)
    return f"unknown key {key!r}{hint}"


def _expected_one_of(choices: tuple[Any, ...]) -> str:
    return "one of " + ", ".join(repr(c) for c in choices)


def explain_enum(text: str, root: type) -> str:
    """``text`` with msgspec's ``Invalid enum value 'x' - at `$.key``` rewritten to name the key and list the
    accepted values of ``root``'s field (e.g. a plan string's ``pp_schedule``); other text unchanged."""
    def sub(m: re.Match) -> str:
        choices = literal_choices(root, m["at"])
        return m[0] if choices is None else f"{m['at']}: expected {_expected_one_of(choices)}, got {m['value']}"

    return _ENUM.sub(sub, text)


def _lookup(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


_TOML_TYPES = {"array": list, "str": str, "float": float, "bool": bool, "object": dict, "int": int}
"""msgspec's name of a value's type (``got `array```) -> the Python type TOML gives it."""


def _dict_entry(at: str, msg: str, tree: dict[str, Any]) -> str:
    """``at`` with its first ``[...]`` (msgspec's mark for "a value of this table") replaced by the key whose value
    has the type the error says it got, e.g. ``model.overrides[...]`` -> ``model.overrides.mrope_section``."""
    table_at = at.split("[...]", 1)[0]
    table = _lookup(tree, table_at.replace("[", ".").replace("]", ""))
    got = re.search(r"got `(\w+)`", msg)
    kind = _TOML_TYPES.get(got[1]) if got else None
    if isinstance(table, dict) and kind is not None:
        for key, value in table.items():
            if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
                return f"{table_at}.{key}"
    return table_at


def explain(err: msgspec.ValidationError, where: str, root: type, tree: dict[str, Any] | None = None) -> ConfigError:
    """msgspec's validation error as one line naming ``where`` and the dotted key; enum fields of ``root`` (the
    config struct) list their accepted values, and a bad value of a table names its key."""
    text = str(err)
    m = _UNKNOWN.match(text)
    if m:
        return ConfigError(f"{where}: {unknown_key(root, m['at'] or '', m['field'])}")
    m = _AT.match(text)
    raw_at = (m["at"] or "") if m else ""
    msg = m["msg"] if m else text
    if "[...]" in raw_at:  # a value of a table (model.overrides): msgspec does not say which key
        raw_at = _dict_entry(raw_at, msg, tree or {})
    at = raw_at.replace("[", ".").replace("]", "")
    choices = literal_choices(root, at) if at else None
    if choices is not None:  # enum fields: list what is accepted
        return ConfigError(f"{where}: {at}: expected {_expected_one_of(choices)}, got {_lookup(tree or {}, at)!r}")
    return ConfigError(f"{where}: {at or 'config'}: {msg.lower().replace('`', '')}")


def note(message: str) -> None:
    """Print ``note: <message>`` on stderr: a value lf adjusted. Once per job: only rank 0 of a torchrun job
    (``RANK``) prints it."""
    if os.environ.get("RANK", "0") == "0":
        print(f"note: {message}", file=sys.stderr, flush=True)


def fit_warmup(cfg: Any, where: str) -> Any:
    """``cfg`` (a :class:`lf_orchestrator.config.Config`) with ``train.warmup_steps`` clamped to ``train.steps``
    when it is longer (a short run of a config written for a long one: ``--set train.steps=20`` on the default's
    100 warm-up steps), saying so with a :func:`note` naming both keys. The clamped value is what the run trains
    with and what its ``config.toml`` (new or resumed) records."""
    t = cfg.train
    if t.steps < 1 or t.warmup_steps <= t.steps:  # steps < 1: check_config names train.steps
        return cfg
    note(f"{where}: train.warmup_steps = {t.warmup_steps} is more than train.steps = {t.steps}; warm-up clamped "
         f"to train.warmup_steps = {t.steps} (the learning rate rises for the whole run)")
    return msgspec.structs.replace(cfg, train=msgspec.structs.replace(t, warmup_steps=t.steps))
