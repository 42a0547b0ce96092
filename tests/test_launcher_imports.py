"""Launchers, the user entry points only, import the installed package as any user script would:
no ``sys.path`` set-up and so no ``noqa: E402`` imports. Scripts that run from a plain checkout
(the GPU check, the kernel model's tables) are developer tools and live in ``tools/``."""

from __future__ import annotations

from pathlib import Path

LAUNCHERS = Path(__file__).resolve().parents[1] / "launchers"


def test_launchers_set_no_path():
    assert {p.name for p in LAUNCHERS.glob("*.py") if "sys.path" in p.read_text()} == set()


def test_launchers_import_at_the_top_without_noqa_e402():
    assert {p.name for p in LAUNCHERS.glob("*.py") if "noqa: E402" in p.read_text()} == set()


def test_launchers_hold_the_user_entry_points_only():
    """Benchmarks live in ``benchmarks/``, developer tools in ``tools/``, studies in ``experiments/``."""
    assert {p.name for p in LAUNCHERS.iterdir() if p.is_file()} == {
        "pretrain.py", "slurm_pretrain.sh", "plan.py", "evaluate.py", "generate.py", "convert_checkpoint.py",
        "prepare_corpus.py", "prepare_data.py", "prepare_prose_corpus.py", "train_tokenizer.py", "quickstart.py"}
