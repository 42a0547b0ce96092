"""Launchers import the installed package as any user script would: no ``sys.path`` set-up
and so no ``noqa: E402`` imports, except the GPU check's three scripts, which run from a plain
checkout on a machine where nothing can be installed (docs/gpu.md)."""

from __future__ import annotations

from pathlib import Path

LAUNCHERS = Path(__file__).resolve().parents[1] / "launchers"
PLAIN_CHECKOUT = {"gpu_check.py", "gpu_smoke.py", "gpu_graph.py"}


def test_only_the_gpu_check_scripts_set_their_own_path():
    setting = {p.name for p in LAUNCHERS.glob("*.py") if "sys.path" in p.read_text()}
    assert setting == PLAIN_CHECKOUT


def test_launchers_import_at_the_top_without_noqa_e402():
    late = {p.name for p in LAUNCHERS.glob("*.py") if "noqa: E402" in p.read_text()}
    assert late <= PLAIN_CHECKOUT
