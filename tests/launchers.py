"""Load a script (``launchers/``, ``benchmarks/`` or ``tools/``) as a module, so tests can call its functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
#: The folders of scripts, searched in this order (a name is in one of them only).
SCRIPT_DIRS = ("launchers", "benchmarks", "tools")


def script_path(name: str) -> Path:
    """``<folder>/<name>.py`` for the one folder of :data:`SCRIPT_DIRS` that holds it."""
    found = [ROOT / d / f"{name}.py" for d in SCRIPT_DIRS if (ROOT / d / f"{name}.py").is_file()]
    if len(found) != 1:
        raise FileNotFoundError(f"{name}.py: expected in exactly one of {SCRIPT_DIRS}, found {found}")
    return found[0]


def load_launcher(name: str) -> ModuleType:
    """The script ``name`` (an entry point, a benchmark or a tool), executed as a fresh module (its
    ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(f"{name}_launcher", script_path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
