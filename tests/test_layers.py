"""The package's layering, read from its source (every import, function-local ones too).

- ``distributed/`` imports nothing from ``models/``: the model side applies parallelism
  (``models/parallelize.py``);
- ``biases/`` (one file per attention bias) sits above ``ops/`` and ``distributed/``, which import
  nothing from it, and below everything that asks it (``models/``, ``plan/``, ``eval/``, ...);
- ``config/`` and ``checkpoint/`` import nothing above them (``train/``, ``eval/``, ``plan/``), and
  ``config/`` nothing from ``checkpoint/``; ``eval/`` and ``plan/`` read configs and checkpoints
  without importing ``train/``;
- ``plsh_dist`` never names ``experiments/`` (the lab registers its own samplers when it
  is imported), neither by an import nor by a module name in a string (importlib).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "plsh_dist"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*module.split(".")[:-node.level], *filter(None, [base])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _strings(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)}


def _files(folder: str = "") -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _files("distributed"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_distributed_imports_nothing_from_models(path):
    assert not {m for m in _imports(path) if m == "plsh_dist.models" or m.startswith("plsh_dist.models.")}


def test_the_package_never_names_the_lab():
    named = {str(p.relative_to(PACKAGE)) for p in _files()
             if any(m == "experiments" or m.startswith("experiments.") for m in _imports(p))
             or any(s == "experiments" or s.startswith("experiments.") for s in _strings(p))}
    assert named == set()
    assert "experiments" not in (PACKAGE / "hashing.py").read_text()


# package -> the packages it must not import (they sit above it)
NOT_BELOW = {
    "ops": ("biases",),
    "distributed": ("biases",),
    "biases": ("models", "data", "config", "checkpoint", "plan", "train", "eval"),
    "config": ("checkpoint", "plan", "train", "eval"),
    "checkpoint": ("plan", "train", "eval"),
    "plan": ("train", "eval"),
    "eval": ("train",),
}


@pytest.mark.parametrize("folder,above", sorted(NOT_BELOW.items()))
def test_lower_packages_import_nothing_above_them(folder, above):
    found = {str(p.relative_to(PACKAGE)): sorted(m for m in _imports(p)
                                                 if any(m == f"plsh_dist.{a}" or m.startswith(f"plsh_dist.{a}.")
                                                        for a in above))
             for p in _files(folder)}
    assert {k: v for k, v in found.items() if v} == {}
