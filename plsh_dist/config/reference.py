"""The config reference, docs/config.md, written from the schema itself so that it cannot drift.

    python -m plsh_dist.config.reference --out docs/config.md    # or without --out: to stdout

Every TOML section of ``RunConfig`` (in its field order) and each of its keys: the type as
annotated, the default, the values it accepts where the section's checks name them, and the
field's docstring (the string literal under the field, read from the source with ``ast``, as
Sphinx's autodoc reads attribute docstrings). Accepted values are read from the checks in
each section's ``__post_init__`` (``_choice(section, "key", self.key, CHOICES)`` and
``if self.key not in CHOICES``); ``OTHER_CHOICES`` adds the fields another module checks
(the attention bias, its backend and method). tests/test_config_reference.py holds
docs/config.md equal to ``markdown()`` and every key to a docstring, and checks that a
value outside each list is refused.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from plsh_dist.biases import BIASES
from plsh_dist.config.schema import RunConfig
from plsh_dist.config_check import toml_literal
from plsh_dist.models.config import presets
from plsh_dist.ops.backends import BACKENDS, METHODS

#: Accepted values checked outside a section's ``__post_init__`` (section, key) -> values.
OTHER_CHOICES: dict[tuple[str, str], tuple] = {
    ("attention", "bias"): tuple(BIASES),  # plsh_dist.biases.bias_class
    ("attention", "backend"): BACKENDS,  # plsh_dist.ops.backends
    ("attention", "method"): METHODS,
    ("model", "preset"): tuple(sorted(presets)),  # ModelConfig.from_dict
}

#: [model] keys that are no ``ModelConfig`` field: (type, default, docstring).
MODEL_EXTRA = {
    "preset": ("str", None, "A preset architecture (``plsh_dist.models.presets``) that the other keys of "
                            "[model] override. A config without a [model] table is ``preset = \"tiny\"``; "
                            "a [model] table without ``preset`` starts from the defaults below."),
    "init_from": ("str | None", None, None),  # its docstring is RunConfig.init_from's
    "family_module": ("str | None", None, None),  # RunConfig.family_module's
}


def sections() -> list[tuple[str, type]]:
    """``(TOML section, dataclass)`` in ``RunConfig``'s order."""
    out = []
    for f in dataclasses.fields(RunConfig):
        if f.default_factory is not dataclasses.MISSING:
            out.append((f.name, type(f.default_factory())))
    return out


def _class_node(cls: type) -> ast.ClassDef:
    return ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring (the string literal right under it), for the fields that have one."""
    body = _class_node(cls).body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def checked_choices(cls: type) -> dict[str, tuple]:
    """Field name -> the values its ``__post_init__`` accepts, where it names them (module doc)."""
    post_init = next((n for n in _class_node(cls).body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__"),
                     None)
    if post_init is None:
        return {}
    namespace = vars(sys.modules[cls.__module__])
    found: dict[str, tuple] = {}
    for node in ast.walk(post_init):
        name = expr = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_choice" \
                and len(node.args) == 4:
            name, expr = _self_attr(node.args[2]), node.args[3]
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.NotIn):
            name, expr = _self_attr(node.left), node.comparators[0]
        if name is not None:
            found[name] = tuple(eval(compile(ast.Expression(expr), "<schema>", "eval"), namespace))  # noqa: S307
    return found


def _markdown_text(doc: str) -> str:
    """reST-ish docstring markup -> Markdown: ``x`` and :role:`x` -> `x`."""
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", doc)
    return doc.replace("``", "`")


def _paragraphs(doc: str) -> list[str]:
    return [" ".join(p.split()) for p in _markdown_text(doc).split("\n\n") if p.strip()]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


def keys(section: str, cls: type) -> list[dict[str, Any]]:
    """One entry per key of ``[section]``: name, type, default, choices (or None), doc (or None)."""
    docs, choices = field_docs(cls), checked_choices(cls)
    run_docs = field_docs(RunConfig)
    entries = []
    if section == "model":
        for name, (tp, default, doc) in MODEL_EXTRA.items():
            entries.append({"name": name, "type": tp, "default": default,
                            "choices": OTHER_CHOICES.get((section, name)), "doc": doc or run_docs.get(name)})
    for f in dataclasses.fields(cls):
        entries.append({"name": f.name, "type": str(f.type), "default": _default(f),
                        "choices": choices.get(f.name, OTHER_CHOICES.get((section, f.name))),
                        "doc": docs.get(f.name)})
    return entries


def _entry(e: dict[str, Any]) -> str:
    default = "unset" if e["default"] is None else f"`{toml_literal(e['default'])}`"
    head = f"- **`{e['name']}`** (`{e['type']}`, default {default}"
    if e["choices"] is not None:
        head += "; one of " + ", ".join(f"`{toml_literal(v)}`" for v in e["choices"])
    paragraphs = _paragraphs(e["doc"]) if e["doc"] else ["(undocumented)"]
    lines = [f"{head}): {paragraphs[0]}"]
    lines += [f"\n  {p}" for p in paragraphs[1:]]
    return "\n".join(lines)


def markdown() -> str:
    """The whole of docs/config.md."""
    names = [name for name, _ in sections()]
    out = [
        "# Config reference",
        "",
        "<!-- Generated by `python -m plsh_dist.config.reference --out docs/config.md` from the schema's",
        "dataclasses and their field docstrings; edit those, not this page (tests/test_config_reference.py",
        "holds the two equal). -->",
        "",
        "A run is one TOML file (`configs/*.toml`) of these sections, each a documented dataclass; a "
        "command-line `--section.key=value` overrides the file, the file the defaults below "
        "(`plsh_dist/config/loading.py`). An unknown section or key is refused, naming the valid ones; "
        "a value of the wrong type or out of range is refused before any work, naming the field and a "
        "valid value. Where a key lists the values it takes, any other is refused. The resolved config "
        "is written next to the outputs and into every checkpoint (`config.resolved.toml`).",
        "",
        "Sections: " + ", ".join(f"[`[{n}]`](#{n})" for n in names) + ".",
    ]
    for name, cls in sections():
        out += ["", f"## [{name}]", "", " ".join(_paragraphs(inspect.getdoc(cls) or ""))]
        out += [""] + [_entry(e) for e in keys(name, cls)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="file to write (default: stdout)")
    args = p.parse_args(argv)
    text = markdown()
    if args.out is None:
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
