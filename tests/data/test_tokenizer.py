"""Exact round-trip of the tokenizer on real Python sources and awkward strings."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from plsh_dist.data.tokenizer import EOS_ID, PAD_ID, Tokenizer, load_or_train_tokenizer, train_tokenizer

AWKWARD = [
    "",
    "\n",
    "\n\n\n",
    "    leading spaces",
    "trailing spaces   ",
    "\tif x:\n\t\treturn 1\n",  # tabs as indentation
    "a\r\nb\r\n",  # CRLF
    "  \t \n  \n",  # whitespace only
    "héllo wörld — 日本語 😀\n",  # non-ASCII, 4-byte UTF-8
    "a\u2581b \u2581\u2581",  # SentencePiece's own space symbol, literally
    "<s></s><unk><pad> <0x41>",  # special-token spellings as plain text
    "x = 12345678901234567890\n",
    "\x00\x0c\x1b[0m",  # control characters
    "ｆｕｌｌ\u3000width",  # would be changed by NFKC; identity keeps it
]


@pytest.mark.parametrize("text", AWKWARD)
def test_round_trip_awkward_strings(tiny_tokenizer, text):
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text


def _tabify(text: str) -> str:
    """Replace each leading group of 4 spaces by a tab (the stdlib itself has no tab-indented file)."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.lstrip(" ")
        out.append("\t" * ((len(line) - len(body)) // 4) + " " * ((len(line) - len(body)) % 4) + body)
    return "".join(out)


def test_round_trip_real_stdlib_files(tiny_tokenizer):
    # Files with non-ASCII text and blank lines, plus tab-indented versions.
    root = Path(sysconfig.get_paths()["stdlib"])
    names = ["getopt.py", "encodings/punycode.py", "textwrap.py", "this.py", "locale.py", "email/charset.py",
             "encodings/koi8_t.py", "tabnanny.py"]
    texts = [(root / n).read_text(encoding="utf-8") for n in names if (root / n).exists()]
    assert len(texts) >= 5, "expected most of these stdlib files to exist"
    texts += [_tabify(t) for t in texts]
    assert any("\t" in t for t in texts) and any(not t.isascii() for t in texts) and any("\n\n" in t for t in texts)
    for text, ids in zip(texts, tiny_tokenizer.encode_batch(texts)):
        assert tiny_tokenizer.decode(ids) == text


def test_round_trip_training_corpus(tiny_tokenizer, corpus_texts):
    for text, ids in zip(corpus_texts, tiny_tokenizer.encode_batch(corpus_texts)):
        assert tiny_tokenizer.decode(ids) == text


def test_special_ids_and_vocab(tiny_tokenizer):
    assert tiny_tokenizer.vocab_size == 512
    assert (tiny_tokenizer.eos_id, tiny_tokenizer.pad_id) == (EOS_ID, PAD_ID) == (2, 3)
    ids = tiny_tokenizer.encode("def f():\n    return 1\n")
    assert all(0 <= i < 512 for i in ids)
    assert EOS_ID not in ids and PAD_ID not in ids
    # Newline is a single user-defined piece, indentation has whitespace-only pieces.
    assert tiny_tokenizer.id_to_piece(tiny_tokenizer.encode("\n")[0]) == "\n"
    assert len(tiny_tokenizer.encode("\n")) == 1


def test_decode_drops_eos(tiny_tokenizer):
    a, b = tiny_tokenizer.encode("x = 1\n"), tiny_tokenizer.encode("y = 2\n")
    assert tiny_tokenizer.decode(a + [EOS_ID] + b) == "x = 1\ny = 2\n"


def test_load_gives_same_ids(tiny_tokenizer, corpus_texts):
    loaded = Tokenizer.load(tiny_tokenizer.path)
    assert loaded.fingerprint == tiny_tokenizer.fingerprint
    assert loaded.encode(corpus_texts[0]) == tiny_tokenizer.encode(corpus_texts[0])


def test_training_is_deterministic(corpus_texts, tmp_path):
    docs = corpus_texts[:10]
    a = train_tokenizer(iter(docs), tmp_path / "a", 400, input_sentence_size=500, seed=3)
    b = train_tokenizer(iter(docs), tmp_path / "b", 400, input_sentence_size=500, seed=3)
    assert a.fingerprint == b.fingerprint


def test_load_or_train_reuses_file(tiny_tokenizer, tmp_path):
    target = tmp_path / "copy.model"
    target.write_bytes(tiny_tokenizer.path.read_bytes())
    # Inputs that would fail if training were attempted: proves the file is reused.
    tok = load_or_train_tokenizer(target, tmp_path / "no_such_file_*.txt", vocab_size=512)
    assert tok.fingerprint == tiny_tokenizer.fingerprint


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(iter(["x"]), tmp_path / "t", 100)
    with pytest.raises(ValueError, match="vocab_size=300 is too small"):
        # 2000 distinct characters cannot fit in 300 pieces at 99.95% character coverage.
        train_tokenizer(iter(["".join(chr(0x4E00 + i) for i in range(2000))] * 3), tmp_path / "t", 300)
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.load(tmp_path / "missing.model")
    with pytest.raises(ValueError, match=r"\.model"):
        load_or_train_tokenizer(tmp_path / "t.bin", [], 512)
