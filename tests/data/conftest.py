"""Shared fixtures for the data tests: a small stdlib corpus and a tiny tokenizer.

Everything is session-scoped and small (40 stdlib files, vocab 512) so the
whole directory runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import os

# No hub access in tests: datasets must only ever read local files.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json  # noqa: E402

import pytest  # noqa: E402

from plsh_dist.data.corpus import write_stdlib_corpus  # noqa: E402
from plsh_dist.data.tokenizer import train_tokenizer  # noqa: E402

SMALL_CORPUS_FILES = 40
TINY_VOCAB = 512


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """CorpusFiles of 40 stdlib files (chosen by stable hash), ~2% held out."""
    return write_stdlib_corpus(tmp_path_factory.mktemp("corpus"), val_fraction=0.1, max_files=SMALL_CORPUS_FILES)


@pytest.fixture(scope="session")
def corpus_texts(small_corpus):
    """The training documents of the small corpus, as strings."""
    with open(small_corpus.train, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


@pytest.fixture(scope="session")
def tiny_tokenizer(small_corpus, tmp_path_factory):
    """A vocab-512 BPE tokenizer trained on the small corpus (about 2 s)."""
    return train_tokenizer(str(small_corpus.train), tmp_path_factory.mktemp("tok") / "tiny", TINY_VOCAB,
                           input_sentence_size=2000)
