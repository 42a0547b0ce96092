"""The token cache: reused when valid, rebuilt when stale or corrupt."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from plsh_dist.data.report import BadDataReport
from plsh_dist.data.token_cache import cache_key, load_or_build_token_stream


def _factory(docs, calls):
    def make(report: BadDataReport):
        calls.append(1)
        return iter(docs)
    return make


@pytest.fixture()
def built(tiny_tokenizer, corpus_texts, tmp_path):
    calls = []
    docs = corpus_texts[:4]
    stream = load_or_build_token_stream(_factory(docs, calls), tiny_tokenizer, tmp_path, {"test": 1}, 0)
    assert calls == [1]
    return stream, docs, tmp_path


def test_second_open_does_not_retokenise(built, tiny_tokenizer):
    stream, docs, root = built
    calls = []
    again = load_or_build_token_stream(_factory(docs, calls), tiny_tokenizer, root, {"test": 1}, 0)
    assert calls == [] and again.path == stream.path
    assert np.array_equal(np.asarray(again.tokens), np.asarray(stream.tokens))
    assert again.tokens.dtype == np.uint16  # vocab 512 fits in 16 bits


def test_key_depends_on_tokenizer_source_and_filter(tiny_tokenizer):
    base = cache_key(tiny_tokenizer, {"files": ["a"]}, 0)
    assert base == cache_key(tiny_tokenizer, {"files": ["a"]}, 0)
    assert base != cache_key(tiny_tokenizer, {"files": ["b"]}, 0)
    assert base != cache_key(tiny_tokenizer, {"files": ["a"]}, 8)


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-6])


def _garble_meta(path):
    (path.parent / "meta.json").write_text("{not json")


def _drop_meta(path):
    (path.parent / "meta.json").unlink()


@pytest.mark.parametrize("damage", [_flip_byte, _truncate, _garble_meta, _drop_meta])
def test_corrupt_cache_is_detected_and_rebuilt(built, tiny_tokenizer, damage, caplog):
    stream, docs, root = built
    good = np.array(stream.tokens)
    damage(stream.path / "tokens.bin")
    calls = []
    with caplog.at_level(logging.WARNING):
        rebuilt = load_or_build_token_stream(_factory(docs, calls), tiny_tokenizer, root, {"test": 1}, 0)
    assert calls == [1], "a damaged cache must be rebuilt from the documents"
    assert np.array_equal(np.asarray(rebuilt.tokens), good)
    if damage in (_flip_byte, _truncate, _garble_meta):
        assert "rebuilding token cache" in caplog.text


def test_meta_records_counts(built):
    stream, docs, _ = built
    meta = json.loads((stream.path / "meta.json").read_text())
    assert meta["num_docs"] == len(docs) == stream.num_docs
    assert meta["num_tokens"] == stream.num_tokens
    assert meta["report"]["kept"] == len(docs)
