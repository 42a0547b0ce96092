"""Building the package's metadata (what ``pip install -e .`` does) prints no setuptools deprecation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_builds_without_deprecation_warnings(tmp_path):
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "plsh_dist").mkdir()
    (tmp_path / "plsh_dist" / "__init__.py").write_text("")
    (tmp_path / "meta").mkdir()
    code = "from setuptools import build_meta; build_meta.prepare_metadata_for_build_wheel('meta')"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Deprecat" not in done.stderr, done.stderr[-2000:]


def test_the_wheel_holds_the_product_only():
    """``launchers/``, ``benchmarks/``, ``tools/`` and ``experiments/`` sit beside the package, not in it."""
    import tomllib

    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert "plsh_dist" in packages
    assert [p for p in packages if p.split(".")[0] != "plsh_dist"] == []
    assert {"tools", "tools.kernel_model", "experiments.approximation"} <= set(find_packages(str(ROOT)))
