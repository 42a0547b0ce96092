"""The embedded stdlib corpus: selection, deterministic split, reuse, bad-file reports."""

from __future__ import annotations

import json

import pytest

from plsh_dist.data import corpus as corpus_mod
from plsh_dist.data.corpus import list_stdlib_files, stable_unit_hash, write_stdlib_corpus


def _sources(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["source"] for line in f]


def test_small_corpus_is_split_and_disjoint(small_corpus):
    train, val = _sources(small_corpus.train), _sources(small_corpus.val)
    assert train and val
    assert not set(train) & set(val)
    assert train == sorted(train) and val == sorted(val)
    skipped = small_corpus.stats.report.skipped
    assert len(train) + len(val) + skipped == 40
    assert small_corpus.stats.train_docs == len(train) and small_corpus.stats.val_docs == len(val)
    assert all("site-packages" not in s for s in train + val)


def test_split_is_a_stable_function_of_the_path():
    # Fixed values: the split must not depend on PYTHONHASHSEED or the machine.
    assert stable_unit_hash(0, "os.py") == stable_unit_hash(0, "os.py")
    assert stable_unit_hash(0, "os.py") != stable_unit_hash(1, "os.py")
    assert 0.0 <= stable_unit_hash(0, "os.py") < 1.0


def test_deterministic_and_reused(tmp_path):
    a = write_stdlib_corpus(tmp_path / "a", max_files=15, seed=4)
    b = write_stdlib_corpus(tmp_path / "b", max_files=15, seed=4)
    assert a.train.read_bytes() == b.train.read_bytes() and a.val.read_bytes() == b.val.read_bytes()
    mtime = a.train.stat().st_mtime_ns
    again = write_stdlib_corpus(tmp_path / "a", max_files=15, seed=4)
    assert again.train.stat().st_mtime_ns == mtime, "an identical manifest must reuse the files"
    assert again.stats == a.stats
    before = _sources(a.train) + _sources(a.val)
    other = write_stdlib_corpus(tmp_path / "a", max_files=15, seed=5)  # same directory, new seed: rewritten
    assert _sources(other.train) + _sources(other.val) != before


def test_damaged_output_is_rewritten(tmp_path):
    a = write_stdlib_corpus(tmp_path, max_files=8)
    good = a.train.read_bytes()
    a.train.write_bytes(good[: len(good) // 2])  # a truncated copy
    b = write_stdlib_corpus(tmp_path, max_files=8)
    assert b.train.read_bytes() == good


def test_bad_files_are_reported_and_skipped(tmp_path, monkeypatch):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "site-packages" / "third").mkdir(parents=True)
    (root / "good.py").write_text("def f():\n    return 'é'\n", encoding="utf-8")
    (root / "pkg" / "__init__.py").write_text("")  # empty
    (root / "pkg" / "blank.py").write_text("\n\n   \n")  # whitespace only
    (root / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\ns = '\xe9'\n")  # valid via its cookie
    (root / "bad_cookie.py").write_bytes(b"# -*- coding: no-such-codec -*-\nx = 1\n")
    (root / "bad_bytes.py").write_bytes(b"x = '\xff\xfe'\n")  # invalid UTF-8, no cookie
    (root / "site-packages" / "third" / "mod.py").write_text("x = 1\n")
    monkeypatch.setattr(corpus_mod, "stdlib_root", lambda: root)

    assert "site-packages/third/mod.py" not in list_stdlib_files(root)
    out = write_stdlib_corpus(tmp_path / "out", val_fraction=0.0)
    report = out.stats.report
    assert report.counts == {"empty_file": 2, "undecodable_file": 2}
    assert sorted(report.examples["undecodable_file"]) == ["bad_bytes.py", "bad_cookie.py"]
    assert sorted(report.examples["empty_file"]) == ["pkg/__init__.py", "pkg/blank.py"]
    texts = {json.loads(l)["source"]: json.loads(l)["text"] for l in out.train.read_text(encoding="utf-8").splitlines()}
    assert texts == {"good.py": "def f():\n    return 'é'\n", "latin.py": "# -*- coding: latin-1 -*-\ns = 'é'\n"}
    assert report.kept == 2


def test_argument_checks(tmp_path):
    with pytest.raises(ValueError, match="val_fraction"):
        write_stdlib_corpus(tmp_path, val_fraction=1.0)
    with pytest.raises(ValueError, match="max_files"):
        write_stdlib_corpus(tmp_path, max_files=0)
