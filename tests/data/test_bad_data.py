"""Bad data is reported with counts per cause, or fails with an error that says what to fix.

One test per case: empty directory, empty files, binary files, invalid UTF-8,
documents shorter than a sequence, nothing usable left, a corpus too small
for one batch; and the per-split report of an end-to-end ``prepare_data``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from plsh_dist.data import DataConfig, TokenizerConfig, build_loader, prepare_data
from plsh_dist.data.loader import PackedLoader
from plsh_dist.data.report import BadDataReport
from plsh_dist.data.sources import iter_documents, resolve_files
from plsh_dist.data.token_cache import build_token_stream

GOOD = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n    y: int = 0\n"
PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


def _write(path, data: bytes | str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


@pytest.fixture()
def messy(tmp_path):
    """Five text files: two good, one empty, one whitespace-only, one binary, one not UTF-8."""
    d = tmp_path / "messy"
    _write(d / "a.txt", GOOD)
    _write(d / "b.txt", GOOD * 3)
    _write(d / "empty.txt", b"")
    _write(d / "blank.txt", "  \n\t\n")
    _write(d / "image.txt", PNG_HEAD + bytes(64))
    _write(d / "latin1.txt", "caf\u00e9 = 1\n".encode("latin-1"))
    return d


@pytest.mark.parametrize("pattern", ["{d}", "{d}/*.txt", "{d}/**/*.txt"], ids=["dir", "glob", "recursive-glob"])
def test_empty_directory_is_named(tmp_path, pattern):
    d = tmp_path / "empty_dir"
    d.mkdir()
    with pytest.raises(ValueError, match=f"matches no file: '{d}' is an empty directory; put the data files there"):
        resolve_files(pattern.format(d=d))


def test_directory_with_files_asks_for_a_glob(messy):
    with pytest.raises(ValueError, match=r"is a directory; name its files with a glob, e.g. '.*/\*\*/\*.txt'"):
        resolve_files(str(messy))


def test_empty_files_counted(messy):
    report = BadDataReport()
    docs = list(iter_documents([str(messy / "a.txt"), str(messy / "empty.txt"), str(messy / "blank.txt")],
                               report=report))
    assert docs == [GOOD]
    assert report.files_read == 3
    assert report.counts == {"empty_file": 2}
    assert sorted(e.rsplit("/", 1)[1] for e in report.examples["empty_file"]) == ["blank.txt", "empty.txt"]


def test_binary_files_counted(messy, tmp_path):
    # NUL bytes are valid UTF-8, so only the binary check keeps this one out.
    zeros = _write(tmp_path / "weights.txt", bytes(1024))
    report = BadDataReport()
    docs = list(iter_documents([str(messy / "a.txt"), str(messy / "image.txt"), str(zeros)], report=report))
    assert docs == [GOOD]
    assert report.counts == {"binary_file": 2} and report.files_read == 3
    assert "binary_file=2" in report.summary("train")


def test_invalid_utf8_counted(messy, tmp_path):
    # An invalid byte far past the first chunk is found too (the whole file is decoded).
    late = _write(tmp_path / "late.txt", b"x = 1\n" * 300_000 + b"\xff\n")
    report = BadDataReport()
    docs = list(iter_documents([str(messy / "a.txt"), str(messy / "latin1.txt"), str(late)],
                               decode_errors="skip_file", report=report))
    assert docs == [GOOD]
    assert report.counts == {"undecodable_file": 2}
    assert report.examples["undecodable_file"][0].endswith("late.txt")


def test_documents_shorter_than_a_sequence_are_packed_and_too_short_ones_dropped(tiny_tokenizer, tmp_path):
    short_docs = [f"v{i} = {i}\n" for i in range(200)]  # a few tokens each: far below seq_len
    stub = "#\n"
    n_short = len(tiny_tokenizer.encode(short_docs[0]))
    assert len(tiny_tokenizer.encode(stub)) < 3 <= n_short  # the stub falls under the minimum, the others do not
    report = BadDataReport()
    docs = [(t, f"doc {i}") for i, t in enumerate(short_docs + [stub])]
    stream = build_token_stream(docs, tiny_tokenizer, tmp_path / "cache", "k", min_doc_tokens=3, report=report)
    assert report.counts == {"short": 1} and "doc 200" in report.examples["short"][0]
    assert report.kept == stream.num_docs == 200
    # Packed: every window is full (seq_len + 1 tokens) although every document is shorter than seq_len.
    seq_len = 32
    assert max(len(tiny_tokenizer.encode(t)) for t in short_docs) < seq_len
    loader = PackedLoader(stream.tokens, seq_len, 4, shuffle=False, loop=False)
    batch = loader.next_batch()
    assert batch["input_ids"].shape == (4, seq_len)
    assert loader.num_windows == (stream.num_tokens - 1) // seq_len > 4


def test_nothing_usable_left_files(messy):
    bad = [str(messy / n) for n in ("empty.txt", "image.txt", "latin1.txt")]
    with pytest.raises(ValueError) as err:
        list(iter_documents(bad, decode_errors="skip_file"))
    msg = str(err.value)
    assert "no usable data file" in msg and "read 3 files; kept 0 documents" in msg
    # Each cause with its count and its fix.
    assert "empty_file=1" in msg and "fill or remove the empty files" in msg
    assert "binary_file=1" in msg and "leave binary files out" in msg
    assert "undecodable_file=1" in msg and "re-encode the files as UTF-8" in msg


def test_nothing_usable_left_all_documents_too_short(tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError) as err:
        build_token_stream(["x", "y = 1"], tiny_tokenizer, tmp_path / "cache", "k", min_doc_tokens=50)
    msg = str(err.value)
    assert "no document survived" in msg and "short=2" in msg
    assert "lower [data].min_doc_tokens" in msg and "< min_doc_tokens=50" in msg


@pytest.mark.parametrize("dp_size", [1, 2], ids=["dp1", "dp2"])
def test_corpus_too_small_for_one_batch(dp_size):
    tokens = np.arange(200)  # 6 windows of 32 (+1) tokens
    with pytest.raises(ValueError) as err:
        PackedLoader(tokens, 32, 8, dp_rank=0, dp_size=dp_size)  # needs 8 x dp_size windows
    msg = str(err.value)
    assert "the corpus is too small: its 200 tokens hold 6 sequences of seq_len=32" in msg
    assert f"micro_batch_size=8 x dp_size={dp_size} = {8 * dp_size} sequences" in msg
    assert f"at least {8 * dp_size * 32 + 1:,} tokens" in msg
    assert "add data, or lower [data].seq_len / [data].micro_batch_size" in msg
    if dp_size == 1:
        # Evaluation reads one pass, partial batches allowed: 6 windows are enough there.
        assert sum(b["input_ids"].shape[0] for b in PackedLoader(tokens, 32, 8, shuffle=False, loop=False)) == 6


def test_prepare_reports_counts_per_cause(messy, tiny_tokenizer, tmp_path, caplog):
    _write(messy / "stub.txt", "#\n")  # one or two tokens: under min_doc_tokens
    cfg = DataConfig(train_files=[str(messy / "*.txt")], seq_len=16, micro_batch_size=2, min_doc_tokens=8,
                     cache_dir=str(tmp_path / "cache"), decode_errors="skip_file")
    tok_cfg = TokenizerConfig(model_path=str(tiny_tokenizer.path), vocab_size=tiny_tokenizer.vocab_size)
    with caplog.at_level("INFO", logger="plsh_dist.data.dataset"):
        data = prepare_data(cfg, tok_cfg)
    report = data.reports["train"]
    assert report.files_read == 7
    assert report.counts == {"empty_file": 2, "binary_file": 1, "undecodable_file": 1, "short": 1}
    assert report.kept == data.train.num_docs == 2
    assert report.tokens_kept == data.train.num_tokens > 0
    summary = report.summary("train")
    assert summary.startswith(f"train: read 7 files; kept 2 documents ({data.train.num_tokens:,} tokens); skipped 5: ")
    assert any(summary.split(": ", 1)[1] in r.getMessage() for r in caplog.records)  # logged as it is
    # A warm start (cache hit) reports the same counts.
    again = prepare_data(cfg, tok_cfg).reports["train"]
    assert (again.files_read, again.counts, again.kept, again.tokens_kept) == (7, report.counts, 2, report.tokens_kept)
    assert next(iter(build_loader(data.train, cfg)))["input_ids"].shape == (2, 16)



def test_skips_name_their_file_and_record(tiny_tokenizer, tmp_path, caplog):
    """A directory of two files: each skip names its own file and the record's number in that file
    (the report named the directory, with a number counted across both files: "mydata record 5")."""
    d = tmp_path / "mydata"
    _write(d / "a.jsonl", "".join(json.dumps({"text": GOOD}) + "\n" for _ in range(3)))
    records = ({"text": GOOD}, {"text": " "}, {"text": 5}, {"text": "#"})  # good, empty, non-string, short
    _write(d / "b.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    cfg = DataConfig(train_files=[str(d / "*.jsonl")], seq_len=16, micro_batch_size=2, min_doc_tokens=8,
                     cache_dir=str(tmp_path / "cache"))
    tok_cfg = TokenizerConfig(model_path=str(tiny_tokenizer.path), vocab_size=tiny_tokenizer.vocab_size)
    with caplog.at_level("INFO", logger="plsh_dist.data.dataset"):
        data = prepare_data(cfg, tok_cfg)
    report = data.reports["train"]
    b = (d / "b.jsonl").resolve()
    assert report.examples["empty"] == [f"{b} record 1"]
    assert report.examples["non_string"] == [f"{b} record 2 (text=int)"]
    (short,) = report.examples["short"]
    assert short.startswith(f"{b} record 3 (") and short.endswith(" tokens < min_doc_tokens=8)")
    assert report.kept == 4  # a.jsonl's three and b.jsonl's first, in order, as they were written: one load of
    # both files had read b.jsonl's mixed column as JSON text ('"..."', '" "', '5'), keeping all but one
    doc = tiny_tokenizer.encode(GOOD) + [tiny_tokenizer.eos_id]
    assert np.array_equal(np.asarray(data.train.tokens), doc * 4)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"(e.g. {b} record 1)" in logged and f"(e.g. {b} record 2 (text=int))" in logged

def test_report_round_trips_and_reads_old_reports():
    report = BadDataReport(kept=3, files_read=5, tokens_kept=1234)
    report.skip("binary_file", "x.bin")
    assert BadDataReport.from_dict(report.to_dict()) == report
    old = {"kept": 2, "counts": {"empty": 1}, "examples": {"empty": ["r 1"]}}  # written before files_read existed
    assert BadDataReport.from_dict(old) == BadDataReport(kept=2, counts={"empty": 1}, examples={"empty": ["r 1"]})


@pytest.mark.parametrize("override, expected", [
    ("--data.train_files=['{d}/empty.txt', '{d}/image.txt']", "data error: no usable data file among"),
    ("--optim.lr=\"fast\"", "config error: [optim].lr must be a finite float, got 'fast' (str)"),
], ids=["empty-and-binary-corpus", "bad-config"])
def test_quickstart_refuses_bad_data_and_config_with_exit_2(messy, tmp_path, override, expected):
    """launchers/quickstart.py: one message and exit 2, no traceback, no training started."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(root / "launchers" / "quickstart.py"), override.format(d=messy),
         f"--data.cache_dir={tmp_path / 'cache'}", f"--tokenizer.model_path={tmp_path / 'tok.model'}",
         f"--run.out_dir={out}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-3000:]
    # The last line is the one message (before it, at most the notice that a tokenizer would be trained).
    assert done.stderr.splitlines()[-1].startswith(expected) and "Traceback" not in done.stderr, done.stderr
    assert "[2/4] training" not in done.stdout and not out.exists()
