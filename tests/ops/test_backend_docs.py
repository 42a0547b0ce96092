"""One source for what the backends do: ``plsh_dist.ops.backends.TABLE``.

The texts that describe it (docs/design.md's copy, the README's and the docstrings' words
about ``backend="auto"``) are held to the table here; the module docstring points at them,
so a row added, moved or taken out of ``backend="auto"`` fails until they say so.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from plsh_dist.ops import backends
from plsh_dist.ops.backends import BACKENDS, TABLE, auto_order, describe_table

ROOT = Path(__file__).resolve().parents[2]


def _table_in(text: str) -> str:
    """The table block of ``text``: from its header line to the decoding line, dedented."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split()[:3] == ["backend", "method", "runs"])
    last = next(i for i in range(first, len(lines)) if lines[i].lstrip().startswith("(decoding)"))
    return textwrap.dedent("\n".join(lines[first:last + 1]))


def _auto_sentence() -> str:
    return "tries " + ", then ".join(auto_order())


def test_the_module_docstring_points_at_the_table_instead_of_copying_it():
    words = " ".join(backends.__doc__.split())
    assert "describe_table" in words and "docs/design.md" in words and "The strategy table" in words
    assert "backend=auto" not in words  # no copy of the table's header
    assert "### The strategy table" in (ROOT / "docs/design.md").read_text()


def test_design_doc_shows_the_table_as_it_is():
    assert _table_in((ROOT / "docs/design.md").read_text()) == textwrap.dedent(describe_table())


def test_the_table_text_has_one_line_per_row():
    rows = describe_table().splitlines()[1:-1]  # header and decoding line apart
    assert [r.split()[:2] for r in rows] == [[row.backend.value, row.method.value] for row in TABLE]
    assert [r.split()[-1] for r in rows] == ["yes" if row.in_auto else "no" for row in TABLE]


def test_the_words_about_backend_auto_follow_the_table():
    """The order ``backend="auto"`` tries, wherever it is said in words."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    design = " ".join((ROOT / "docs/design.md").read_text().split())
    assert auto_order()[0] == TABLE[0].backend.value  # the first row is in auto
    for text in (readme, design):
        assert _auto_sentence() in text
    assert "flash-attn varlen first" not in readme + design
    for backend in BACKENDS:  # the README's list of backends names every one
        assert f"`{backend}`" in readme


def test_docstrings_point_at_the_table_instead_of_restating_it():
    """``Backend.AUTO``, ``plsh_attention(backend=)`` and ``[attention].backend`` name no order."""
    from plsh_dist.models import config
    from plsh_dist.ops import plsh

    sources = [Path(backends.__file__).read_text().split('AUTO = "auto"', 1)[1].split("TORCH =", 1)[0],
               Path(plsh.__file__).read_text().split("backend: one of", 1)[1].split("sampler:", 1)[0],
               Path(config.__file__).read_text().split('backend: str = "auto"', 1)[1].split("method:", 1)[0]]
    for text in sources:
        words = " ".join(text.split())
        assert "table" in words
        assert "else" not in words and "first" in words  # "the first row ... that applies", no order of its own
