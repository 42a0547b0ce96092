"""The English-prose corpus (the Jargon File from Debian's jargon-text): sections and
lexicon runs become documents, the split is stable, reruns reuse the files, a missing
package is a clear error. A synthetic file in the same layout keeps the test
independent of the package; the real file is checked too where it is installed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from plsh_dist.data.corpus import JARGON_FILE, jargon_documents, write_prose_corpus
from plsh_dist.data.sources import iter_documents

NBSP = "\u00a0"


def _fake_jargon(entries: int = 30) -> str:
    lines = ["                                The Jargon File", "", "   Table of Contents", "", "   Glossary", ""]
    for n in (1, 2):
        lines += [f"Chapter{NBSP}{n}. Title {n}", "", f"   Prose of chapter {n}, indented by three spaces.", "",
                  "Sub Heading", "", "   More prose.", ""]
    lines += ["Glossary", "", "   0", "", "   abbrev", ""]  # the headword index: left out
    for i in range(entries):
        lines += [f"   :word{i:02d}: n.", "", f"   Entry {i} explains a word. " * 12, ""]
    lines += [f"Appendix{NBSP}A. Folklore", "", "   The Story of Mel.", "", "Bibliography", "", "   Books.", ""]
    return "\n".join(lines) + "\n"


def test_documents_of_the_jargon_layout():
    docs = jargon_documents(_fake_jargon(), chunk_chars=1000)
    keys = [k for k, _ in docs]
    assert keys[:2] == ["chapter-1", "chapter-2"] and keys[-2:] == ["appendix-a", "bibliography"]
    lex = [(k, t) for k, t in docs if k.startswith("lexicon")]
    assert len(lex) > 3 and lex[0][0] == "lexicon-000-word00"
    assert all(t.startswith(":word") for _, t in lex)  # whole entries, dedented; the headword index is gone
    assert sum(t.count(":word") for _, t in lex) == 30
    assert "Sub Heading" in dict(docs)["chapter-1"] and "Table of Contents" not in "".join(t for _, t in docs)
    assert dict(docs)["chapter-1"].splitlines()[2] == "Prose of chapter 1, indented by three spaces."
    with pytest.raises(ValueError, match="does not look like the Jargon File"):
        jargon_documents("just some text\n")


def test_write_prose_corpus(tmp_path):
    src = tmp_path / "jargon.txt.gz"
    src.write_bytes(gzip.compress(_fake_jargon(60).encode("utf-8")))
    a = write_prose_corpus(tmp_path / "out", src, val_fraction=0.2, chunk_chars=1000)
    assert a.stats.val_docs >= 1 and a.stats.train_docs >= 1
    val = [json.loads(x)["source"] for x in a.val.read_text().splitlines()]
    assert any(s.startswith("jargon/lexicon") for s in val)
    before = a.train.stat().st_mtime_ns
    b = write_prose_corpus(tmp_path / "out", src, val_fraction=0.2, chunk_chars=1000)  # reused, not rewritten
    assert b.stats == a.stats and b.train.stat().st_mtime_ns == before
    docs = list(iter_documents([str(a.train)]))  # the ordinary local-file reader takes it
    assert len(docs) == a.stats.train_docs
    with pytest.raises(ValueError, match="apt-get install jargon-text"):
        write_prose_corpus(tmp_path / "x", tmp_path / "missing.txt.gz")


def test_prose_corpus_launcher_reports_a_missing_package(tmp_path, capsys):
    from launchers.prepare_prose_corpus import main

    assert main(["--out", str(tmp_path / "o"), "--source", str(tmp_path / "none.gz")]) == 2
    assert "jargon-text" in capsys.readouterr().err


@pytest.mark.skipif(not Path(JARGON_FILE).is_file(), reason="Debian package jargon-text not installed")
def test_real_jargon_file(tmp_path):
    c = write_prose_corpus(tmp_path / "jargon")
    s = c.stats
    assert s.train_docs + s.val_docs > 80 and s.train_chars > 1_000_000 and s.val_docs >= 3
    text = c.val.read_text() + c.train.read_text()
    assert "The Story of Mel" in text and ":hacker: n." in text
