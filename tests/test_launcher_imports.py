"""Launchers import the installed package as any user script would: no ``sys.path`` set-up and so
no ``noqa: E402`` imports. Scripts that run from a plain checkout (the GPU check, the kernel model's
tables) are developer tools and live in ``tools/``."""

from __future__ import annotations

from pathlib import Path

LAUNCHERS = Path(__file__).resolve().parents[1] / "launchers"


def test_launchers_set_no_path():
    assert {p.name for p in LAUNCHERS.glob("*.py") if "sys.path" in p.read_text()} == set()


def test_launchers_import_at_the_top_without_noqa_e402():
    assert {p.name for p in LAUNCHERS.glob("*.py") if "noqa: E402" in p.read_text()} == set()
