"""transformers' remote-code convention for exports: ``from_pretrained(dir, trust_remote_code=True)``
in a Python that has torch, transformers and sentencepiece and no plsh_dist.

An export's ``config.json`` names plsh_dist's model types (``qwen3_plsh`` ...) and an ``auto_map``
pointing at three entry modules it carries (``tokenizer_config.json`` points at the third)::

    configuration_plsh.py   Qwen3PlshConfig, LlamaPlshConfig, MistralPlshConfig
    modeling_plsh.py        Qwen3PlshForCausalLM, LlamaPlshForCausalLM, MistralPlshForCausalLM
    tokenization_plsh.py    PlshTokenizer

(the classes of the package's own families, :data:`plsh_dist.models.families.BUILT_IN`, and of the
saved model's family when it is one registered outside the package). Each entry class subclasses,
adding nothing, the class of the same name that ``plsh_export.py`` chooses once per process (and
says which, once, on transformers' logger), asking the chosen code's ``hf_config.export_class``:

- the installed package's own (``import plsh_dist.models`` works): the model is exactly the one
  the package builds, with every kernel the package has (the fused Triton kernel on CUDA);
- otherwise the **bundle**: a copy of the package's modelling code carried in the export, one
  file per module, generated here at export time from the package's own sources, so it is never a
  second, hand-kept implementation. It computes with the PyTorch paths of every mode (PLSH's two
  methods, fixed blocks, exact / windowed / truncated ALiBi, no bias; KV-cache decoding, padding
  masks, packed ``position_ids``): the code and the numbers of the package on those paths.

The bundle is the import closure of ``BUNDLE_ROOTS`` under ``plsh_dist/`` (every ``plsh_dist`` import
a module makes, at any depth), each module ``plsh_dist.a.b`` written as ``plsh_a_b.py`` (the root
package as ``plsh_package.py``) with its ``plsh_dist`` imports rewritten to relative ones:
transformers copies into its module cache the files an entry module names in ``from .name import``
lines (followed recursively), flat in one folder, and refuses a module that imports a package that
is not installed (``dynamic_module_utils.check_imports``, outside ``try`` blocks). What is not in
the closure stays out: the Triton kernels (loaded by name only where Triton runs; a copy without
them runs without Triton, :mod:`plsh_dist.ops.triton.runtime`), DeepSpeed, training and data
preparation. An import of another package that a bundled module makes inside a function (Triton,
``datasets``) is reached only on paths the export does not take; it is wrapped in
``try: ... except ImportError: raise`` (no change to what runs), the form transformers' check
treats as optional. The generator checks that every bundled file imports nothing outside
``REQUIRED`` and the standard library, and that transformers' own copier reaches every file.

The classes' own ``save_pretrained`` writes all of it (``Qwen3PlshForCausalLM`` and the others:
``auto_map``, the model's entry modules and the bundle; ``PlshTokenizer``: its ``auto_map``, the
third and the bundle), so a directory re-saved from a loaded export is as loadable as the export,
whichever code loaded it: an export's copy of this module copies the bundle it was loaded with.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

from plsh_dist.models.families import BUILT_IN, FAMILIES, Family

#: The entry modules a saved model needs (its config and model classes); a saved tokenizer needs the third.
MODEL_MODULES = ("configuration_plsh.py", "modeling_plsh.py")
TOKENIZER_MODULES = ("tokenization_plsh.py",)
ENTRY_MODULES = MODEL_MODULES + TOKENIZER_MODULES
#: The generated module that chooses between the installed package and the bundle.
CHOOSER = "plsh_export.py"
#: What the modelling code is (its import closure is the bundle).
BUNDLE_ROOTS = ("plsh_dist.models.hf_config", "plsh_dist.models.hf_tokenizer", "plsh_dist.models.window_cache")
#: The packages a bundled module may import outside a ``try`` (with the standard library).
REQUIRED = ("torch", "transformers", "sentencepiece", "numpy", "safetensors")

_PACKAGE = "plsh_dist"
#: This module is the package's own (not an export's bundled copy): it generates the bundle.
_IN_PACKAGE = __name__ == "plsh_dist.models.remote_code"


def auto_map(family_class_prefix: str) -> dict[str, str]:
    """``config.json``'s ``auto_map`` for a family's ``class_prefix`` (``"Qwen3"`` / ``"Llama"`` / ...)."""
    return {"AutoConfig": f"configuration_plsh.{family_class_prefix}PlshConfig",
            "AutoModelForCausalLM": f"modeling_plsh.{family_class_prefix}PlshForCausalLM"}


def add_tokenizer_auto_map(directory: str | Path) -> None:
    """Point ``tokenizer_config.json``'s ``auto_map`` at ``tokenization_plsh.PlshTokenizer``."""
    path = Path(directory) / "tokenizer_config.json"
    table = json.loads(path.read_text())
    table["auto_map"] = {"AutoTokenizer": ["tokenization_plsh.PlshTokenizer", None]}
    path.write_text(json.dumps(table, indent=2, ensure_ascii=False) + "\n")


def write_remote_code(directory: str | Path, names=ENTRY_MODULES, *, family: Family | None = None) -> None:
    """Write the entry modules ``names`` (default all three), the chooser and the bundle into a saved
    directory; ``family``: the saved model's (its classes join the built-in families' in the entry
    modules). The package generates them from its sources; an export's copy of this module copies
    the bundle and the chooser it was loaded with (the folder it sits in: transformers' module cache)."""
    directory = Path(directory)
    unknown = set(names) - set(ENTRY_MODULES)
    if unknown:
        raise ValueError(f"write_remote_code: {sorted(unknown)} are not entry modules {ENTRY_MODULES}")
    if _IN_PACKAGE:
        sources = bundle_sources(family)
        wanted = [n for n in sources if n not in ENTRY_MODULES] + [n for n in ENTRY_MODULES if n in names]
        for name in wanted:
            (directory / name).write_text(sources[name])
        return
    # transformers copies an entry module and what it imports into a folder of its own per entry
    # module: the bundle and the chooser are all here, the entry modules are written anew
    here = Path(__file__).resolve().parent
    if here != directory.resolve():
        for path in sorted(here.glob("plsh_*.py")):
            shutil.copyfile(path, directory / path.name)
    for name, text in _entries(family).items():
        if name in names:
            (directory / name).write_text(text)


# --- the generator (runs in the package) ------------------------------------------------


def bundle_name(module: str) -> str:
    """The bundle's file for ``plsh_dist.a.b``: ``plsh_a_b.py`` (``plsh_dist`` itself: ``plsh_package.py``)."""
    parts = module.split(".")
    if parts[0] != _PACKAGE:
        raise ValueError(f"{module} is not a {_PACKAGE} module")
    return "plsh_" + ("_".join(parts[1:]) if len(parts) > 1 else "package") + ".py"


def _package_root() -> Path:
    return Path(__file__).resolve().parents[1]


def _module_file(module: str) -> Path | None:
    """The source file of ``plsh_dist.<...>`` (a package's ``__init__.py``), or None when it is no module."""
    path = _package_root().parent.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


class _Import:
    """One ``plsh_dist`` import statement: the modules it binds as modules and the names it takes from one."""

    def __init__(self, node: ast.stmt):
        self.node = node
        self.modules: list[tuple[str, str]] = []  # (module, bound name)
        self.names: list[tuple[str, str, str | None]] = []  # (module, name, as)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is None:
                    raise ValueError(f"line {node.lineno}: 'import {alias.name}' binds the package {_PACKAGE}; "
                                     f"the bundle needs 'from ... import' or 'import ... as'")
                self.modules.append((alias.name, alias.asname))
            return
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            if _module_file(sub) is not None:
                self.modules.append((sub, alias.asname or alias.name))
            else:
                self.names.append((node.module, alias.name, alias.asname))

    def targets(self) -> list[str]:
        return [m for m, _ in self.modules] + sorted({m for m, _, _ in self.names})

    def relative(self) -> str:
        """The statement rewritten to the bundle's flat relative imports (one line)."""
        statements = [f"from . import {bundle_name(m)[:-3]} as {bound}" for m, bound in self.modules]
        by_module: dict[str, list[str]] = {}
        for module, name, asname in self.names:
            by_module.setdefault(module, []).append(name if asname is None else f"{name} as {asname}")
        statements += [f"from .{bundle_name(m)[:-3]} import {', '.join(n)}" for m, n in by_module.items()]
        return "; ".join(statements)


def _is_ours(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == _PACKAGE for a in node.names)
    return isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == _PACKAGE


def _imports(tree: ast.Module) -> tuple[list[_Import], list[ast.stmt]]:
    """The ``plsh_dist`` imports of a module, and its imports of other packages that are neither
    ``REQUIRED`` nor the standard library and not inside a ``try`` already (at any depth)."""
    ours, optional = [], []

    def visit(node: ast.AST, in_try: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.ImportFrom) and child.level:
                    raise ValueError(f"line {child.lineno}: a relative import; the bundle rewrites absolute "
                                     f"{_PACKAGE} imports only")
                if _is_ours(child):
                    ours.append(_Import(child))
                    continue
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module]
                tops = {n.split(".")[0] for n in names}
                if not in_try and not tops <= set(REQUIRED) | set(sys.stdlib_module_names) | {"__future__"}:
                    optional.append(child)
            visit(child, in_try or isinstance(child, ast.Try))

    visit(tree, False)
    return ours, optional


def _closure() -> dict[str, tuple[str, ast.Module]]:
    """Module -> (source, tree) for the import closure of ``BUNDLE_ROOTS``."""
    found: dict[str, tuple[str, ast.Module]] = {}
    todo = list(BUNDLE_ROOTS)
    while todo:
        module = todo.pop()
        if module in found:
            continue
        path = _module_file(module)
        if path is None:
            raise ValueError(f"{module}: no such module under {_package_root()}")
        source = path.read_text()
        tree = ast.parse(source, str(path))
        found[module] = (source, tree)
        for imp in _imports(tree)[0]:
            todo.extend(imp.targets())
    names: dict[str, str] = {}
    for module in found:
        clash = names.setdefault(bundle_name(module), module)
        if clash != module:
            raise ValueError(f"{clash} and {module} would both be bundled as {bundle_name(module)}")
    return dict(sorted(found.items()))


def _rewrite(module: str, source: str, tree: ast.Module) -> str:
    """``source`` with its ``plsh_dist`` imports made relative and its optional imports wrapped."""
    lines = source.splitlines()
    ours, optional = _imports(tree)
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line, replacement), 1-based
    for stmt in [*((i.node, i) for i in ours), *((node, None) for node in optional)]:
        node, imp = stmt
        first, last = node.lineno, node.end_lineno
        indent = lines[first - 1][: node.col_offset]
        if indent.strip() or lines[last - 1][node.end_col_offset:].strip().split("#")[0].strip():
            raise ValueError(f"{module} line {first}: an import that shares its line with other code")
        if imp is not None:
            new = [indent + imp.relative()] + [""] * (last - first)  # the line numbers stay the package's
        else:
            if node in tree.body:
                raise ValueError(f"{module} line {first}: imports {ast.unparse(node)!r} at import time; a "
                                 f"bundled module may import only {', '.join(REQUIRED)} and the standard library")
            new = [indent + "try:  # optional here: a path the export does not take (transformers' import check)",
                   *("    " + line for line in lines[first - 1:last]),
                   indent + "except ImportError:", indent + "    raise"]
        edits.append((first, last, new))
    for first, last, new in sorted(edits, reverse=True):
        lines[first - 1:last] = new
    header = (f"# Bundled by plsh_dist from {module} (plsh_dist/models/remote_code.py): its imports of plsh_dist "
              f"are relative here.\n")
    return header + "\n".join(lines) + "\n"


def _regex_reach(sources: dict[str, str], entry: str) -> set[str]:
    """The files transformers copies for ``entry`` (``dynamic_module_utils.get_relative_import_files``:
    lines of the form ``from .name import``, followed recursively)."""
    pattern = re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE)
    seen, todo = set(), [entry]
    while todo:
        for name in pattern.findall(sources.get(todo.pop(), "")):
            if f"{name}.py" not in seen:
                seen.add(f"{name}.py")
                todo.append(f"{name}.py")
    return seen


@functools.lru_cache(maxsize=1)
def _bundle_modules() -> tuple[tuple[str, str], ...]:
    """(file name, text) of every bundled module."""
    return tuple((bundle_name(m), _rewrite(m, source, tree)) for m, (source, tree) in _closure().items())


def bundle_sources(family: Family | None = None) -> dict[str, str]:
    """File name -> text of everything an export carries as code: the bundle, the chooser and the
    entry modules (``family``: as ``write_remote_code``'s). ValueError when the package's sources
    cannot be bundled (module doc)."""
    from plsh_dist import __version__

    sources = dict(_bundle_modules())
    digest = hashlib.sha256()
    for name, text in sorted(sources.items()):
        digest.update(f"{name}\0{text}\0".encode())
    bundle_id = digest.hexdigest()[:16]
    chooser = _chooser(__version__, [], bundle_id)
    unreached = sorted(set(sources) - _regex_reach({**sources, CHOOSER: chooser}, CHOOSER))
    sources[CHOOSER] = _chooser(__version__, unreached, bundle_id)
    sources.update(_entries(family))
    missing = set(sources) - set(ENTRY_MODULES) - {CHOOSER} - _regex_reach(sources, CHOOSER)
    if missing:
        raise ValueError(f"transformers would not copy {sorted(missing)} into its module cache")
    return sources


def _classes(family: Family | None = None) -> tuple[list[str], list[str], list[str]]:
    """The entry modules' class names: config classes, model classes, tokenizer classes; of the built-in
    families and ``family``."""
    families = [FAMILIES[name] for name in BUILT_IN]
    if family is not None and family.name not in BUILT_IN:
        families.append(family)
    return ([f.config_class_name for f in families], [f.model_class_name for f in families], ["PlshTokenizer"])


def _chooser(version: str, unreached: list[str], bundle_id: str) -> str:
    configs, models, tokenizers = _classes()
    classes = configs + models + tokenizers
    touch = "".join(f"\n        from .{n[:-3]} import __name__ as _  # noqa: F401" for n in unreached)
    return f'''"""Which code this export runs: the installed plsh_dist package's, or the copy of its modelling code
bundled here (the plsh_*.py files), which needs only torch, transformers and sentencepiece.

Chosen once per process, and said once on transformers' logger. Generated by plsh_dist {version}
(plsh_dist/models/remote_code.py); the bundle is that version's code. The code registers process-wide
names (transformers' "plsh_dist" attention, torch's "plsh_dist::" operators, the model types), so a
process runs one copy: an export loaded after another takes the first one's classes (the same
bundle, or the package), and an export that bundles other code is refused.
"""

import sys

from transformers.utils import logging

BUNDLED_VERSION = {version!r}
#: A digest of the bundled files: two exports with the same one carry the same code.
BUNDLE_ID = {bundle_id!r}
#: The classes of the built-in families (a chooser that an older export carries reads these from the first one).
CLASSES = {tuple(classes)!r}
_FIRST = "_plsh_dist_export_code"  # sys.modules key: the chooser whose classes this process uses

_first = sys.modules.get(_FIRST)
if _first is not None:
    if _first.SOURCE == "bundle" and _first.BUNDLE_ID != BUNDLE_ID:
        raise ImportError(f"this process already runs the code bundled with another plsh_dist export (plsh_dist "
                          f"{{_first.BUNDLED_VERSION}}, bundle {{_first.BUNDLE_ID}}; this one: {{BUNDLED_VERSION}}, "
                          f"{{BUNDLE_ID}}), and the two cannot share it: load this export in a new process, or "
                          f"install plsh_dist, whose code every export then runs")
    SOURCE, NOTICE = _first.SOURCE, _first.NOTICE
    # the first chooser's code; one of an older export has its classes as attributes
    export_class = getattr(_first, "export_class", None) or (lambda name: getattr(_first, name))
else:
    try:  # the installed package: the model it builds, with all its kernels (the fused Triton kernel on CUDA)
        from plsh_dist import __version__ as _installed
        from plsh_dist.models.hf_config import export_class
        SOURCE = "package"
        NOTICE = (f"this plsh_dist export runs the installed plsh_dist {{_installed}} (bundled: "
                  f"{{BUNDLED_VERSION}}): all its kernels, the fused Triton kernel on CUDA where Triton runs")
        logging.get_logger(__name__).info(NOTICE)
    except ImportError as _missing:
        SOURCE, NOTICE = "bundle", f"plsh_dist cannot be imported ({{_missing}})"

    if SOURCE == "bundle":
        from .plsh_models_hf_config import export_class
        from .plsh_models_hf_tokenizer import PlshTokenizer  # noqa: F401
        # Modules the bundle imports only as modules ("from . import m"): named here so transformers
        # copies them too (it follows "from .m import" lines).{touch}
        NOTICE += (f": this export runs the plsh_dist {{BUNDLED_VERSION}} code bundled with it, on its PyTorch "
                   f"paths (no fused Triton kernel; install plsh_dist for it)")
        logging.get_logger(__name__).warning(NOTICE)
    sys.modules[_FIRST] = sys.modules[__name__]


def __getattr__(name):
    """The entry modules' classes (``from .plsh_export import Qwen3PlshConfig``): the chosen code's.
    An ImportError, not an AttributeError, so that the import names what is missing."""
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return export_class(name)
    except AttributeError as exc:
        raise ImportError(str(exc)) from None
'''


def _entries(family: Family | None = None) -> dict[str, str]:
    configs, models, tokenizers = _classes(family)
    head = ('"""plsh_dist export: transformers loads this directory with trust_remote_code=True.\n\n'
            'The classes are those plsh_export.py chooses (the installed plsh_dist package\'s, else the\n'
            'code bundled here); subclasses so that transformers\' re-save marks them, not the chosen ones.\n"""\n\n')

    def module(classes: list[str]) -> str:
        imports = "from .plsh_export import " + ", ".join(f"{c} as _{c}" for c in classes) + "\n"
        return head + imports + "".join(f"\n\nclass {c}(_{c}):\n    pass\n" for c in classes)

    return {"configuration_plsh.py": module(configs), "modeling_plsh.py": module(models),
            "tokenization_plsh.py": module(tokenizers)}
