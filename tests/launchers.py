"""Load a launcher script (``launchers/<name>.py``) as a module, so tests can call its functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

LAUNCHERS = Path(__file__).resolve().parents[1] / "launchers"


def load_launcher(name: str) -> ModuleType:
    """``launchers/<name>.py``, executed as a fresh module (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(f"{name}_launcher", LAUNCHERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
