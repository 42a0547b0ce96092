"""Type checks of config dataclasses, read from their annotations (one rule for every section).

Every config section (``[run]``, ``[data]``, ``[model]``, ...) is a dataclass
whose ``__post_init__`` first calls ``check_field_types(self, "section")``;
value checks (ranges, choices) follow. A wrong type then fails the same way
in every section, naming the field, what it got and a valid line to write:

    [optim].lr must be a finite float, got 'fast' (str); e.g. lr = 0.0003

Rules (TOML values are what arrives here):

- ``int``: ints only; ``True``/``False`` are refused (Python's bool is an int,
  TOML's is not), and so is ``2.0`` (a float where a count is meant is a typo).
- ``float``: finite floats, and ints (converted: ``lr = 1`` means 1.0); ``inf`` and
  ``nan`` are refused: no setting means them, and they fail only later, mid-run.
- ``bool``: ``true``/``false`` only; neither 1 nor "yes".
- ``str``: strings only.
- ``list[str]``: a list (or tuple, converted to a list) of strings.
- ``list[dict]``: a list of tables (TOML's ``[[section.key]]``), each checked by its section.
- ``X | None``: ``None`` (the key left out: TOML has no null) or an ``X``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from typing import Any


_NAMES = {int: "an int", float: "a finite float", bool: "a bool (true or false)", str: "a string",
          dict: "a table"}
# A valid value per type, for fields whose default cannot serve as the example (None).
_PLACEHOLDERS: dict[Any, Any] = {int: 1, float: 1.0, bool: True, str: "...", list: ["..."]}


def _split_optional(tp) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"config fields support 'X | None' unions only, got {tp}")
        return args[0], True
    return tp, False


def describe_type(tp) -> str:
    """Words for an annotation: ``int | None`` -> 'an int (or left out)'."""
    base, optional = _split_optional(tp)
    if typing.get_origin(base) is list:
        (item,) = typing.get_args(base)
        words = f"a list of {_NAMES[item].split(' ', 1)[1]}s"
    else:
        words = _NAMES[base]
    return words + (" (or left out)" if optional else "")


def toml_literal(value: Any, strict: bool = False) -> str:
    """``value`` as it would be written in a TOML file (resolved configs, and the
    'e.g.' part of messages). ``strict``: raise for values TOML cannot hold,
    instead of falling back to ``repr``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v, strict) for v in value) + "]"
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):  # an inline table
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_literal(v, strict)}" for k, v in value.items()) + "}"
    if strict:
        raise ValueError(f"cannot write {value!r} ({type(value).__name__}) to TOML")
    return repr(value)


def did_you_mean(unknown: list[str], valid: list[str]) -> str:
    """``" (did you mean 'lr'?)"`` for the closest valid key of each unknown one, or ``""``."""
    pairs = [(u, difflib.get_close_matches(u, valid, n=1)) for u in unknown]
    hints = [f"{u!r} -> {m[0]!r}" for u, m in pairs if m]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def _coerce(value: Any, tp) -> tuple[bool, Any]:
    """(ok, normalised value) for a non-optional annotation ``tp``."""
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    if tp is dict:  # a table: its keys are its section's to check
        return isinstance(value, dict) and all(isinstance(k, str) for k in value), value
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            return False, value
        checked = [_coerce(v, item) for v in value]
        return all(ok for ok, _ in checked), [v for _, v in checked]
    raise TypeError(f"check_field_types does not know the annotation {tp!r}; add a rule for it")


def _example(f: dataclasses.Field, tp, examples: dict[str, Any]) -> Any:
    """``examples[name]``, else the field's default when it is a value, else a placeholder of the right type."""
    base, _ = _split_optional(tp)
    if f.name in examples:
        return examples[f.name]
    if f.default is not dataclasses.MISSING and f.default is not None:
        return f.default
    return _PLACEHOLDERS[typing.get_origin(base) or base]


def check_field_types(obj: Any, section: str, examples: dict[str, Any] | None = None) -> None:
    """Check every init field of dataclass ``obj`` against its annotation; normalise in place.

    Ints given for floats become floats and tuples given for lists become
    lists. Raises ValueError ``"[section].name must be <type>, got <value>
    (<type>); e.g. name = <example>"`` on the first field of the wrong type.
    ``examples``: name -> a telling value for fields whose default is None.
    """
    examples = examples or {}
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        tp = hints[f.name]
        value = getattr(obj, f.name)
        base, optional = _split_optional(tp)
        if value is None and optional:
            continue
        ok, normalised = _coerce(value, base)
        if not ok:
            raise ValueError(
                f"[{section}].{f.name} must be {describe_type(tp)}, got {value!r} ({type(value).__name__}); "
                f"e.g. {f.name} = {toml_literal(_example(f, tp, examples))}"
            )
        if normalised is not value:
            setattr(obj, f.name, normalised)
