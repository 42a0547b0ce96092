"""docs/config.md is the schema's own reference (plsh_dist/config/reference.py): equal to what the
generator writes from the dataclasses, every key documented, and each list of accepted values
what the checks accept: a value outside it is refused by the config."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path

import pytest

from plsh_dist.config import config_from_table
from plsh_dist.config.reference import keys, markdown, sections
from tests.launchers import load_launcher

ROOT = Path(__file__).resolve().parents[1]


def test_docs_config_md_is_the_generators_output():
    assert (ROOT / "docs" / "config.md").read_text() == markdown(), (
        "docs/config.md is stale: python -m plsh_dist.config.reference --out docs/config.md")


def test_every_section_and_key_is_there_with_a_docstring():
    text = markdown()
    for name, cls in sections():
        assert f"\n## [{name}]\n" in text
        entries = {e["name"]: e for e in keys(name, cls)}
        assert set(entries) >= {f.name for f in dataclasses.fields(cls)}
        undocumented = sorted(k for k, e in entries.items() if not e["doc"])
        assert not undocumented, f"[{name}] keys without a docstring: {undocumented}"
        for key in entries:
            assert f"- **`{key}`** (" in text
    assert '- **`compile`** (`str`, default `"off"`; one of `"off"`, `"inductor"`, `"aot_eager"`)' in text
    assert "- **`zero_stage`** (`int`, default `0`; one of `0`, `1`, `2`, `3`)" in text


CHOICES = [(name, e["name"], e["choices"]) for name, cls in sections() for e in keys(name, cls) if e["choices"]]


@pytest.mark.parametrize("section,key,choices", CHOICES, ids=[f"{s}.{k}" for s, k, _ in CHOICES])
def test_a_value_outside_the_listed_ones_is_refused(section, key, choices):
    outside = max(choices) + 1 if all(isinstance(c, int) for c in choices) else "not-a-listed-value"
    table = {"model": {"preset": "tiny", key: outside}} if section == "model" else {section: {key: outside}}
    with pytest.raises(ValueError, match=key):
        config_from_table(table)
    config_from_table({"model": {"preset": "tiny"}} if section == "model" else {section: {key: choices[0]}})


def test_pretrain_help_lists_the_sections_and_the_page():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        load_launcher("pretrain").main(["--help"])
    text = " ".join(out.getvalue().split())
    assert "docs/config.md" in text
    for name, _ in sections():
        assert f"[{name}]" in text
