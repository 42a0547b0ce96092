"""Load a launcher script (``launchers/<name>.py``) as a module, so tests can call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

LAUNCHERS = Path(__file__).resolve().parents[1] / "launchers"


def load_launcher(name: str) -> ModuleType:
    """``launchers/<name>.py``, executed as a fresh module (its ``main`` is not run).

    ``launchers/`` goes on ``sys.path`` first, as Python puts a script's folder there: the
    launchers import their sibling ``lab_samplers``.
    """
    if str(LAUNCHERS) not in sys.path:
        sys.path.insert(0, str(LAUNCHERS))
    spec = importlib.util.spec_from_file_location(f"{name}_launcher", LAUNCHERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
