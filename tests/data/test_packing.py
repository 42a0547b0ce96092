"""Packing: EOS after every document, no token lost or duplicated, global shift before the SP cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plsh_dist.data.loader import PackedLoader
from plsh_dist.data.packing import gather_windows, num_windows, split_for_sp
from plsh_dist.data.token_cache import build_token_stream
from plsh_dist.data.tokenizer import EOS_ID


@pytest.fixture(scope="module")
def stream(tiny_tokenizer, corpus_texts, tmp_path_factory):
    docs = corpus_texts[:6]
    return build_token_stream(docs, tiny_tokenizer, tmp_path_factory.mktemp("pack"), "k", min_doc_tokens=0), docs


def test_eos_after_every_document(stream, tiny_tokenizer):
    s, docs = stream
    tokens = np.asarray(s.tokens)
    ends = np.flatnonzero(tokens == EOS_ID)
    assert len(ends) == len(docs) == s.num_docs and ends[-1] == len(tokens) - 1
    starts = np.concatenate([[0], ends[:-1] + 1])
    for doc, a, b in zip(docs, starts, ends):
        assert tiny_tokenizer.decode(tokens[a:b].tolist()) == doc


@pytest.mark.parametrize("seq_len", [7, 64, 100])
def test_windows_cover_stream_once(stream, seq_len):
    tokens = np.asarray(stream[0].tokens)
    n = num_windows(len(tokens), seq_len)
    assert n == (len(tokens) - 1) // seq_len and n > 0
    w = gather_windows(tokens, np.arange(n), seq_len)  # (n, T + 1)
    batch = split_for_sp(w)
    inputs, labels = batch["input_ids"].reshape(-1).numpy(), batch["labels"].reshape(-1).numpy()
    # Every token (up to the dropped tail) is an input exactly once and a label exactly once.
    assert np.array_equal(inputs, tokens[: n * seq_len])
    assert np.array_equal(labels, tokens[1 : n * seq_len + 1])
    assert len(tokens) - (n * seq_len + 1) < seq_len  # only a tail shorter than one window is dropped


@pytest.mark.parametrize("sp_size", [1, 2, 4])
def test_sp_chunks_rebuild_the_globally_shifted_sequence(stream, sp_size):
    tokens = np.asarray(stream[0].tokens)
    seq_len = 32
    w = gather_windows(tokens, np.array([3, 0, 5]), seq_len)
    full = split_for_sp(w)
    assert torch.equal(full["labels"][:, :-1], full["input_ids"][:, 1:])
    chunks = [split_for_sp(w, r, sp_size) for r in range(sp_size)]
    for key in ("input_ids", "labels", "position_ids"):
        assert all(c[key].shape == (3, seq_len // sp_size) and c[key].dtype == torch.long for c in chunks)
        assert torch.equal(torch.cat([c[key] for c in chunks], dim=1), full[key])
    for r in range(sp_size - 1):
        # Across a chunk border: the last label of rank r is the first input of rank r + 1.
        assert torch.equal(chunks[r]["labels"][:, -1], chunks[r + 1]["input_ids"][:, 0])
        assert torch.equal(chunks[r + 1]["position_ids"][0, :1], torch.tensor([(r + 1) * seq_len // sp_size]))
    assert torch.equal(full["position_ids"], torch.arange(seq_len).expand(3, seq_len))


def test_sp_divisibility_error_names_the_field(stream):
    tokens = stream[0].tokens
    with pytest.raises(ValueError, match=r"\[data\]\.seq_len=30 is not divisible by \[parallel\]\.sp_size=4"):
        PackedLoader(tokens, 30, 2, sp_rank=0, sp_size=4)
    with pytest.raises(ValueError, match="sp_rank"):
        PackedLoader(tokens, 32, 2, sp_rank=4, sp_size=4)
    with pytest.raises(ValueError, match="seq_len"):
        split_for_sp(np.zeros((1, 31)), 0, 4)


def test_too_little_data_for_dp_is_an_error():
    with pytest.raises(ValueError, match="dp_size=4"):
        PackedLoader(np.arange(20), 8, 1, dp_rank=0, dp_size=4)
