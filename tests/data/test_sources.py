"""Bad data is counted and skipped, never silently used; globs and formats resolve."""

from __future__ import annotations

import json

import numpy as np
import pytest

from plsh_dist.data.report import BadDataReport
from plsh_dist.data.sources import builder_for, iter_documents, resolve_files
from plsh_dist.data.token_cache import build_token_stream
from plsh_dist.data.tokenizer import EOS_ID

GOOD = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n    y: int = 0\n"


@pytest.fixture()
def messy_dir(tmp_path):
    """A jsonl with every kind of bad record, text files good/empty/undecodable."""
    records = [
        {"text": GOOD},
        {"text": ""},  # empty
        {"text": "   \n\t "},  # whitespace only -> empty
        {"text": 5},  # non-string
        {"text": None},  # non-string
        {"text": ["a list"]},  # non-string
        {"other": "no text field"},  # missing -> non-string
        {"text": "x"},  # short (1-2 tokens)
        {"text": GOOD * 2},
    ]
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text(GOOD, encoding="utf-8")
    (tmp_path / "txt" / "b.txt").write_bytes(b"print('ok')\n# \xff\xfe broken bytes\n")
    (tmp_path / "txt" / "c.txt").write_bytes(b"")
    (tmp_path / "txt" / "d.txt").write_text("  \n\n", encoding="utf-8")
    return tmp_path


def test_jsonl_bad_records_counted(messy_dir, tiny_tokenizer, tmp_path):
    report = BadDataReport()
    docs = list(iter_documents(str(messy_dir / "records.jsonl"), report=report, with_location=True))
    assert [d for d, _ in docs] == [GOOD, "x", GOOD * 2]
    assert report.counts == {"empty": 2, "non_string": 4}
    assert any("int" in e for e in report.examples["non_string"])  # says what type it got
    stream = build_token_stream(docs, tiny_tokenizer, tmp_path / "cache", "k", min_doc_tokens=8, report=report)
    assert report.counts == {"empty": 2, "non_string": 4, "short": 1}
    assert report.kept == stream.num_docs == 2
    expected = tiny_tokenizer.encode(GOOD) + [EOS_ID] + tiny_tokenizer.encode(GOOD * 2) + [EOS_ID]
    assert np.array_equal(np.asarray(stream.tokens), expected)


def test_text_files_empty_and_undecodable_skipped(messy_dir):
    report = BadDataReport()
    docs = list(iter_documents(str(messy_dir / "txt" / "*.txt"), decode_errors="skip_file", report=report))
    assert docs == [GOOD]  # a text file is one document
    assert report.counts == {"undecodable_file": 1, "empty_file": 2}
    assert report.examples["undecodable_file"][0].endswith("b.txt")
    assert "undecodable_file=1" in report.summary("test")


def test_all_files_bad_is_an_error(messy_dir):
    with pytest.raises(ValueError, match="no usable data file"):
        list(iter_documents([str(messy_dir / "txt" / "b.txt"), str(messy_dir / "txt" / "c.txt")],
                            decode_errors="skip_file"))


def test_streaming_and_map_style_agree(messy_dir, tmp_path):
    a = list(iter_documents(str(messy_dir / "records.jsonl"), streaming=True))
    b = list(iter_documents(str(messy_dir / "records.jsonl"), streaming=False, hf_cache_dir=str(tmp_path / "hf")))
    assert a == b == [GOOD, "x", GOOD * 2]


def test_parquet_and_text_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": [GOOD, None, "second document"]}), tmp_path / "part-0.parquet")
    report = BadDataReport()
    docs = list(iter_documents(str(tmp_path / "*.parquet"), text_field="content", report=report))
    assert docs == [GOOD, "second document"]
    assert report.counts == {"non_string": 1}


def test_globs_and_format_errors(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.jsonl", "sub/b.jsonl", "c.parquet"):
        (tmp_path / name).write_text("{}\n")
    assert [p.name for p in resolve_files(str(tmp_path / "**" / "*.jsonl"))] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(ValueError, match="matches no file"):
        resolve_files(str(tmp_path / "nothing*.txt"))
    with pytest.raises(ValueError, match="mix formats"):
        builder_for(resolve_files([str(tmp_path / "a.jsonl"), str(tmp_path / "c.parquet")]))
    assert builder_for(resolve_files(str(tmp_path / "a.jsonl"))) == "json"
    with pytest.raises(ValueError, match="exactly one"):
        list(iter_documents(None))


def test_dataset_name_path(tmp_path, tiny_tokenizer):
    # Any name load_dataset accepts goes through the same checks; offline, a
    # local dataset directory (split files by name) stands in for a hub name.
    from plsh_dist.data import DataConfig, data_sources, load_token_stream

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.jsonl").write_text(
        "\n".join(json.dumps({"body": t}) for t in [GOOD, "", GOOD * 3]) + "\n", encoding="utf-8")
    (tmp_path / "ds" / "validation.jsonl").write_text(json.dumps({"body": GOOD}) + "\n", encoding="utf-8")
    cfg = DataConfig(dataset_name=str(tmp_path / "ds"), val_split="validation", text_field="body",
                     cache_dir=str(tmp_path / "cache"), min_doc_tokens=1)
    sources = data_sources(cfg)
    assert set(sources) == {"train", "val"}
    report = BadDataReport()
    train = load_token_stream(sources["train"], cfg, tiny_tokenizer, report)
    assert train.num_docs == 2 and report.counts == {"empty": 1}
    val = load_token_stream(sources["val"], cfg, tiny_tokenizer)
    assert val.num_docs == 1 and val.path != train.path


def test_save_to_disk_directories_are_read_with_load_from_disk(tmp_path):
    """A Dataset's directory is its one split ``train``; a DatasetDict's split is picked by name; a split
    either lacks is refused naming the splits there are."""
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["a doc", "", "another doc"]})
    ds.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": ds, "validation": ds.select([2])}).save_to_disk(str(tmp_path / "dict"))
    report = BadDataReport()
    assert list(iter_documents(dataset_name=str(tmp_path / "one"), report=report)) == ["a doc", "another doc"]
    assert report.counts == {"empty": 1}
    assert list(iter_documents(dataset_name=str(tmp_path / "dict"), split="validation")) == ["another doc"]
    with pytest.raises(ValueError, match=r"split 'test' is not in the save_to_disk directory .*\['train', 'validation'\]"):
        list(iter_documents(dataset_name=str(tmp_path / "dict"), split="test"))
    with pytest.raises(ValueError, match="holds one Dataset .*read as split 'train'.*unset \\[data\\].val_split"):
        list(iter_documents(dataset_name=str(tmp_path / "one"), split="validation"))
