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
