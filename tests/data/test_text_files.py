"""Plain-text files: streamed in chunks, cut by line / paragraph / separator, bad bytes replaced and counted."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from plsh_dist.data import text_reader
from plsh_dist.data.config import DataConfig, TokenizerConfig
from plsh_dist.data.dataset import prepare_data
from plsh_dist.data.report import BadDataReport
from plsh_dist.data.sources import iter_documents

SEP = "<|endoftext|>"


@pytest.fixture()
def tiny_chunks(monkeypatch):
    """Reads of 3 bytes: every separator, CRLF and multi-byte character straddles a chunk somewhere."""
    monkeypatch.setattr(text_reader, "READ_CHUNK", 3)


def _texts() -> list[str]:
    fixed = ["a\nb\n", "a\n\n", "a\r\nb\rc\r", "x\n\n\ny\n\n", "\n\nx", "a\n\n\n\nb", "caf\u00e9 \u20ac\n\U0001F600\n"]
    rng = random.Random(0)
    pieces = ["a", "b", " ", "\n", "\r", "\r\n", "\n\n", "\u00e9", "\u20ac", "\U0001F600", "\n\n\n"]
    return fixed + ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(60)]


@pytest.mark.parametrize("sample_by", ["line", "paragraph", "document"])
def test_documents_equal_the_datasets_text_builder(sample_by, tiny_chunks, tmp_path):
    # The reader replaced datasets' text builder for local files: the same documents, so the same tokens.
    import datasets

    for i, text in enumerate(_texts()):
        path = tmp_path / f"{i}.txt"
        path.write_bytes(text.encode())
        ref = [r["text"] for r in datasets.load_dataset("text", data_files=[str(path)], split="train",
                                                        streaming=True, sample_by=sample_by)]
        assert list(text_reader.read_text_documents(path, sample_by)) == ref, repr(text)


@pytest.mark.parametrize("sep", [SEP, "\f"])
def test_doc_separator_cuts_a_file_into_documents(sep, tiny_chunks, tmp_path):
    docs = ["first doc\nline two", "\nsecond, after a newline\n", "third \u20ac"]
    (tmp_path / "a.txt").write_text(sep + sep.join(docs[:2]) + sep + sep + docs[2] + sep, encoding="utf-8")
    (tmp_path / "b.txt").write_text("no separator at all\n", encoding="utf-8")
    report = BadDataReport()
    got = list(iter_documents(str(tmp_path / "*.txt"), doc_separator=sep, report=report, with_location=True))
    # In file order; kept as they are; no document for the separators at the ends or the two in a row.
    assert [t for t, _ in got] == docs + ["no separator at all\n"]
    assert [w.rsplit("/", 1)[1] for _, w in got] == ["a.txt record 0", "a.txt record 1", "a.txt record 2",
                                                      "b.txt record 0"]
    assert report.counts == {} and report.files_read == 2


def test_a_one_line_file_streams_in_bounded_memory(tmp_path):
    # 24 MB on one line, 4 KB documents between separators: held whole (as datasets' text builder
    # does, the line or the document) it would take 24 MB or more; the reader keeps one document
    # and a chunk or two (1 MiB each).
    doc = "x" * 4095 + " "
    path = tmp_path / "one_line.txt"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(6000):
            f.write(f"{i:05d}" + doc + SEP)
    tracemalloc.start()
    try:
        n = sum(1 for _ in iter_documents(str(path), doc_separator=SEP))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 6000
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB of Python memory for a 24 MB file"


def test_lines_stream_in_bounded_memory(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text(("y" * 1000 + "\n") * 24_000, encoding="utf-8")  # 24 MB of lines
    tracemalloc.start()
    try:
        n = sum(1 for _ in iter_documents(str(path), sample_by="line"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 24_000
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB of Python memory for a 24 MB file"


def _bad_file(path):
    """A text file with bytes that are not UTF-8 at known offsets: (path, its text as Python's
    errors='replace' reads it, the bytes replaced, the offsets of the invalid sequences)."""
    data = (b"ok line\r\n"            # CRLF: read as "\n" like any text file
            b"\xff bad start\n"        # offset 9: one invalid byte
            b"trunc \xe2\x82 euro\n"   # offset 27: a truncated 3-byte sequence, 2 bytes, one U+FFFD
            + b"pad\n" * 3 + b"\xc3\xa9 fine \xc0\xaf\n"  # an overlong encoding: 2 invalid bytes, 2 U+FFFD
            + b"tail\n" * 2 + b"\x80")  # a lone continuation byte, at the very end
    path.write_bytes(data)
    offsets = [9, 27, data.index(b"\xc0"), data.index(b"\xaf"), len(data) - 1]
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
    return path, text, 6, offsets


def test_decode_errors_replace_counts_bytes_and_offsets(tiny_chunks, tmp_path):
    path, text, n_bytes, offsets = _bad_file(tmp_path / "bad.txt")
    (tmp_path / "good.txt").write_text("all fine\n", encoding="utf-8")
    report = BadDataReport()
    docs = list(iter_documents([str(path), str(tmp_path / "good.txt")], decode_errors="replace", report=report))
    assert docs == [text, "all fine\n"]  # the file is kept, each invalid sequence one U+FFFD
    assert text.count("\ufffd") == 5
    # The report names the file (not its directory), the bytes replaced and where the first ones are.
    assert report.counts == {}
    assert report.replaced == {str(path.resolve()): {"bytes": n_bytes, "offsets": offsets}}
    summary = report.summary("train")
    assert f"replaced 6 bytes that are not UTF-8 by U+FFFD in 1 file ({path.resolve()}: 6 bytes, first at " \
           f"{', '.join(map(str, offsets))}; byte offsets)" in summary
    assert "[data].decode_errors = 'skip_file'" in summary
    again = BadDataReport.from_dict(json.loads(json.dumps(report.to_dict())))  # stored in the cache's meta.json
    assert again.replaced == report.replaced and again.summary("train") == summary


def test_replaced_offsets_past_the_first_chunk(tmp_path):
    # 3 MiB of good text, then bad bytes: offsets count from the file's start across 1 MiB reads.
    head = b"z = 1\n" * (3 << 19)
    path = tmp_path / "late.txt"
    path.write_bytes(head + b"\xff\n" + b"\xfe" * 7 + b"\n")
    report = BadDataReport()
    docs = list(iter_documents(str(path), sample_by="line", report=report))
    assert docs[-2:] == ["\ufffd", "\ufffd" * 7]
    assert report.replaced == {str(path.resolve()): {"bytes": 8, "offsets": [len(head) + i for i in (0, 2, 3, 4, 5)]}}


def test_decode_errors_skip_file_leaves_the_file_out(tmp_path):
    path, _, _, _ = _bad_file(tmp_path / "bad.txt")
    (tmp_path / "good.txt").write_text("all fine\n", encoding="utf-8")
    report = BadDataReport()
    docs = list(iter_documents([str(path), str(tmp_path / "good.txt")], decode_errors="skip_file", report=report))
    assert docs == ["all fine\n"]
    assert report.counts == {"undecodable_file": 1} and report.examples["undecodable_file"] == [str(path.resolve())]
    assert report.replaced == {}


def test_decode_errors_replace_is_the_default_and_reported_by_prepare(tiny_tokenizer, tmp_path):
    path, text, n_bytes, offsets = _bad_file(tmp_path / "bad.txt")
    (tmp_path / "good.txt").write_text("def f(x):\n    return x + 1\n" * 20, encoding="utf-8")
    tok_cfg = TokenizerConfig(model_path=str(tiny_tokenizer.path), vocab_size=tiny_tokenizer.vocab_size)
    common = dict(train_files=[str(tmp_path / "*.txt")], seq_len=8, micro_batch_size=1, min_doc_tokens=1,
                  cache_dir=str(tmp_path / "cache"))
    cfg = DataConfig(**common)
    assert cfg.decode_errors == "replace"
    data = prepare_data(cfg, tok_cfg)
    report = data.reports["train"]
    assert report.replaced == {str(path.resolve()): {"bytes": n_bytes, "offsets": offsets}}
    assert report.kept == data.train.num_docs == 2
    # A warm start reads the report from the cache; skip_file is another cache (other tokens).
    assert prepare_data(cfg, tok_cfg).reports["train"].replaced == report.replaced
    skipped = prepare_data(DataConfig(**common, decode_errors="skip_file"), tok_cfg)
    assert skipped.train.path != data.train.path and skipped.train.num_docs == 1
    assert skipped.reports["train"].counts == {"undecodable_file": 1} and skipped.reports["train"].replaced == {}


def test_doc_separator_through_prepare_data(tiny_tokenizer, tmp_path):
    docs = [f"def f{i}(x):\n    return x + {i}\n" for i in range(5)]
    (tmp_path / "corpus.txt").write_text(SEP.join(docs), encoding="utf-8")
    tok_cfg = TokenizerConfig(model_path=str(tiny_tokenizer.path), vocab_size=tiny_tokenizer.vocab_size)
    common = dict(train_files=[str(tmp_path / "corpus.txt")], seq_len=8, micro_batch_size=1, min_doc_tokens=1,
                  cache_dir=str(tmp_path / "cache"))
    split = prepare_data(DataConfig(**common, doc_separator=SEP), tok_cfg).train
    whole = prepare_data(DataConfig(**common), tok_cfg).train
    assert (split.num_docs, whole.num_docs) == (5, 1) and split.path != whole.path
    expected = [t for d in docs for t in tiny_tokenizer.encode(d) + [tiny_tokenizer.eos_id]]
    assert list(split.tokens) == expected


@pytest.mark.parametrize("kwargs, message", [
    ({"decode_errors": "ignore"}, r"\[data\].decode_errors must be 'replace' .* or 'skip_file' .*, got 'ignore'"),
    ({"doc_separator": ""}, r"\[data\].doc_separator is empty: set the string between documents"),
    ({"doc_separator": SEP, "sample_by": "line"},
     r"\[data\].doc_separator = '<\|endoftext\|>' cuts files into documents and \[data\].sample_by = 'line' cuts "
     r"them into lines: keep one"),
])
def test_bad_text_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        DataConfig(**kwargs)
    assert "\n" not in str(err.value)
