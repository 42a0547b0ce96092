"""A token cache build is cut into chunks: an interrupted build resumes from the chunks it completed,
and any number of threads gives the tokens of a 1-thread build, bit for bit."""

from __future__ import annotations

import json

import pytest

from plsh_dist.data.token_cache import PARTIAL_DIR, build_token_stream

CHUNK = 64 << 10  # bytes of text per chunk: the small corpus makes a dozen


def _interrupted(docs: list[str], after: int):
    yield from docs[:after]
    raise KeyboardInterrupt  # Ctrl-C (or a kill) while the source is read


def test_an_interrupted_build_resumes_and_equals_a_fresh_one_thread_build(tiny_tokenizer, corpus_texts, tmp_path,
                                                                          monkeypatch):
    docs = corpus_texts * 2
    fresh = build_token_stream(iter(docs), tiny_tokenizer, tmp_path / "fresh", "k", 8, threads=1, chunk_bytes=CHUNK)

    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        build_token_stream(_interrupted(docs, len(docs) // 2), tiny_tokenizer, cache, "k", 8, threads=2,
                           chunk_bytes=CHUNK)
    # Nothing a reader takes for a cache: no meta.json, no tokens; the completed chunks are kept.
    assert not (cache / "meta.json").exists() and not (cache / "tokens.bin").exists()
    assert not (cache / "tokens.bin.tmp").exists()
    records = sorted((cache / PARTIAL_DIR).glob("chunk_*.json"))
    assert len(records) >= 2
    done_docs = sum(json.loads(p.read_text())["docs"] for p in records)

    encoded = []
    encode = tiny_tokenizer.encode_batch
    monkeypatch.setattr(tiny_tokenizer, "encode_batch",
                        lambda texts, num_threads=1: encoded.append(len(texts)) or encode(texts, num_threads))
    # The default chunk size differs: the interrupted build's own is kept, or no chunk would match.
    resumed = build_token_stream(iter(docs), tiny_tokenizer, cache, "k", 8, threads=2)
    assert sum(encoded) == len(docs) - done_docs  # the completed chunks were not tokenised again
    assert (cache / "tokens.bin").read_bytes() == (tmp_path / "fresh" / "tokens.bin").read_bytes()
    assert (resumed.num_docs, resumed.report.counts) == (fresh.num_docs, fresh.report.counts)
    assert not (cache / PARTIAL_DIR).exists()


def test_chunks_of_other_documents_are_not_reused(tiny_tokenizer, corpus_texts, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        build_token_stream(_interrupted(corpus_texts, len(corpus_texts) // 2), tiny_tokenizer, cache, "k", 8,
                           chunk_bytes=CHUNK)
    other = [text.upper() for text in corpus_texts]  # same count, other text (a file edited in place, say)
    stream = build_token_stream(iter(other), tiny_tokenizer, cache, "k", 8, chunk_bytes=CHUNK)
    fresh = build_token_stream(iter(other), tiny_tokenizer, tmp_path / "fresh", "k", 8, chunk_bytes=CHUNK)
    assert (cache / "tokens.bin").read_bytes() == (tmp_path / "fresh" / "tokens.bin").read_bytes()
    assert stream.num_docs == fresh.num_docs
