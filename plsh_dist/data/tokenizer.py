"""SentencePiece tokenizer with settings that round-trip source code exactly.

Choices, and why:

- ``model_type="bpe"``: on the stdlib corpus BPE trains far faster than
  unigram for the same vocabulary, and compresses code slightly better
  (figures: results/tokenizer/README.md). Encoding is deterministic either way.
- ``normalization_rule_name="identity"``, ``remove_extra_whitespaces=False``,
  ``add_dummy_prefix=False``: the text is never rewritten, so leading spaces,
  runs of spaces and full-width characters come back unchanged.
- ``byte_fallback=True``: any character outside the vocabulary becomes its
  UTF-8 bytes, so there is no <unk> and every string round-trips.
- ``"\\n"`` and ``"\\t"`` are user-defined symbols: one token each, never
  merged away. SentencePiece reads its *input* one sentence per line; we feed
  it chunks of whole lines through ``sentence_iterator`` with their newlines
  kept, so it learns what really follows a newline (indentation pieces,
  thanks to ``allow_whitespace_only_pieces``).
- ``split_digits=True``: numbers are spelled digit by digit.

One SentencePiece quirk is handled in ``encode``: the literal character
U+2581 (the space meta symbol) would otherwise decode as a space; we encode
it as its three byte-fallback tokens instead, which decode back to U+2581.

Special ids: unk=0, bos=1, eos=2, pad=3 (fixed, so packed caches and models
agree on them without reading the model file).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import sentencepiece as spm

from plsh_dist.data.report import BadDataReport
from plsh_dist.data.sources import iter_documents

logger = logging.getLogger(__name__)

UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
_SPACE_META = "\u2581"  # SentencePiece's visible space; a literal one needs escaping
# SentencePiece rejects training sentences longer than max_sentence_length
# bytes; documents are cut at line boundaries into chunks below this.
_MAX_SENTENCE_BYTES = 8192


class Tokenizer:
    """A loaded SentencePiece model plus the exact-round-trip encode/decode.

    ``decode(encode(text)) == text`` for every Python ``str`` without lone
    surrogates (tested on stdlib sources with tabs, unicode, blank lines, CRLF).
    """

    def __init__(self, model_proto: bytes, path: Path | None = None):
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.path = path
        #: sha256 of the model file: keys token caches so a new model never reuses old tokens.
        self.fingerprint = hashlib.sha256(model_proto).hexdigest()
        for name, want, got in (("unk", UNK_ID, self._sp.unk_id()), ("bos", BOS_ID, self._sp.bos_id()),
                                ("eos", EOS_ID, self._sp.eos_id()), ("pad", PAD_ID, self._sp.pad_id())):
            if got != want:
                raise ValueError(f"tokenizer model {path} has {name}_id={got}, expected {want}; retrain it with train_tokenizer")
        self._space_bytes = [self._sp.piece_to_id(f"<0x{b:02X}>") for b in _SPACE_META.encode("utf-8")]
        if any(i == UNK_ID for i in self._space_bytes):
            raise ValueError(f"tokenizer model {path} was trained without byte_fallback; retrain it with train_tokenizer")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load a ``.model`` file written by ``train_tokenizer`` (or any compatible one)."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"tokenizer model {path} does not exist; train one with launchers/train_tokenizer.py")
        return cls(path.read_bytes(), path)

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """Token ids of each text; SentencePiece encodes the batch on ``num_threads`` (-1 = all cores)."""
        # Split every text at literal U+2581 and encode the pieces in one batch,
        # then join them with the byte tokens of U+2581.
        pieces, owners = [], []
        for t, text in enumerate(texts):
            parts = text.split(_SPACE_META) if _SPACE_META in text else [text]
            pieces.extend(parts)
            owners.append(len(parts))
        encoded = self._sp.encode(pieces, num_threads=num_threads) if pieces else []
        out, k = [], 0
        for n in owners:
            ids = list(encoded[k])
            for j in range(1, n):
                ids += self._space_bytes + encoded[k + j]
            out.append(ids)
            k += n
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens (bos, eos, pad) decode to nothing."""
        return self._sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))


def _line_chunks(documents: Iterable[str], max_bytes: int = _MAX_SENTENCE_BYTES // 2) -> Iterator[str]:
    """Cut documents into chunks of whole lines (newlines kept) of at most ~max_bytes."""
    for doc in documents:
        buf, size = [], 0
        for line in doc.splitlines(keepends=True):
            n = len(line.encode("utf-8"))
            if n > max_bytes:
                # A single giant line (minified data, long literals): hard-split it.
                if buf:
                    yield "".join(buf)
                    buf, size = [], 0
                step = max_bytes // 4  # characters; a character is at most 4 UTF-8 bytes
                for i in range(0, len(line), step):
                    yield line[i : i + step]
                continue
            if size + n > max_bytes and buf:
                yield "".join(buf)
                buf, size = [], 0
            buf.append(line)
            size += n
        if buf:
            yield "".join(buf)


def _train_spm(sentences: Iterator[str], model: io.BytesIO, vocab_size: int, input_sentence_size: int,
               num_threads: int) -> None:
    """One SentencePiece training call with the code-friendly settings (module docstring)."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        user_defined_symbols=["\n", "\t"],
        character_coverage=0.9995,  # rare characters go to byte fallback instead of taking vocab slots
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True,
        max_sentence_length=_MAX_SENTENCE_BYTES,
        unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID,
        num_threads=num_threads,
        minloglevel=2,  # SentencePiece's own progress log is thousands of lines
    )


def _counted(documents: Iterable[str], report: BadDataReport) -> Iterator[str]:
    """Pass documents through, counting them as kept in ``report``."""
    for doc in documents:
        report.kept += 1
        yield doc


def train_tokenizer(
    inputs: str | os.PathLike | Sequence[str | os.PathLike] | Iterable[str],
    model_prefix: str | os.PathLike,
    vocab_size: int = 8192,
    *,
    text_field: str = "text",
    input_sentence_size: int = 20_000,
    seed: int = 0,
    num_threads: int = 2,
    data_label: str | None = None,
) -> Tokenizer:
    """Train a BPE SentencePiece model and write it to ``{model_prefix}.model``.

    Args:
        inputs: a path/glob (str or PathLike) or a list/tuple of them (text,
            jsonl, parquet; read with ``iter_documents``, bad files counted and
            skipped, bytes that are not UTF-8 in a text file replaced), or any
            other iterable (e.g. a generator, ``iter(list)``) yielding document strings.
        model_prefix: output path without extension.
        vocab_size: pieces including the 4 special ids, the 256 byte pieces and
            ``\\n``/``\\t``; must be at least 300.
        text_field: field holding the text in jsonl/parquet inputs.
        input_sentence_size: at most this many line chunks (~4 KB each) are
            sampled for training (reservoir sampling with ``seed``): bounds the
            time (figures: results/tokenizer/README.md).
        seed: makes the sampling, hence the model, reproducible.
        num_threads: SentencePiece trainer threads.
        data_label: what ``inputs`` are, for the error of data too small for
            ``vocab_size`` (default: the paths, when ``inputs`` are paths).
    """
    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300 (4 special + 256 byte pieces + merges), got {vocab_size}")
    if input_sentence_size < 1:
        raise ValueError(f"input_sentence_size must be >= 1, got {input_sentence_size}")
    report = None
    if isinstance(inputs, (str, os.PathLike, list, tuple)):
        report = BadDataReport()
        documents: Iterable[str] = _counted(
            iter_documents(list(inputs) if isinstance(inputs, tuple) else inputs, text_field=text_field, report=report),
            report,
        )
    else:
        documents = inputs
    prefix = Path(model_prefix)

    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    start = time.perf_counter()
    try:
        _train_spm(_line_chunks(documents), model, vocab_size, input_sentence_size, num_threads)
    except RuntimeError as e:
        if "Vocabulary size is smaller than required_chars" in str(e):
            raise ValueError(
                f"vocab_size={vocab_size} is too small for the characters of this data ({e}); "
                "increase vocab_size"
            ) from e
        most = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", str(e))
        if most:  # a corpus too small for this many merges
            raise ValueError(_too_small(vocab_size, int(most.group(1)), data_label or (
                str(list(inputs) if isinstance(inputs, tuple) else inputs) if report is not None else None))) from None
        raise
    proto = model.getvalue()
    model_path = prefix.with_name(prefix.name + ".model")
    model_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = model_path.with_name(model_path.name + ".tmp")
    tmp.write_bytes(proto)
    os.replace(tmp, model_path)
    tok = Tokenizer(proto, model_path)
    if report is not None:
        report.log(logger, "tokenizer training data")
    logger.info("trained tokenizer %s: vocab %d in %.1f s", model_path, tok.vocab_size, time.perf_counter() - start)
    return tok


def _too_small(vocab_size: int, most: int, data: str | None) -> str:
    """The refusal of training data that SentencePiece can make at most ``most`` pieces of."""
    fix = (f"set a smaller [tokenizer].vocab_size (at most {most}: --tokenizer.vocab_size={most}) or train on "
           "more data" if most >= 300 else
           "train on more data (vocab_size cannot go below 300: 260 special and byte pieces, and merges)")
    return (f"[tokenizer].vocab_size = {vocab_size} is too large for the tokenizer's training data"
            f"{f' {data}' if data else ''}: SentencePiece can make at most {most} pieces of it; {fix}, or point "
            "[tokenizer].model_path at an existing tokenizer")


def load_or_train_tokenizer(model_path: str | os.PathLike, train_inputs, vocab_size: int = 8192, **kwargs) -> Tokenizer:
    """Load ``model_path`` if it exists, else train it from ``train_inputs`` (quickstart path),
    saying so first: a mistyped path must not pass for the tokenizer meant.

    ``model_path`` ends in ``.model``; extra kwargs go to ``train_tokenizer``.
    """
    model_path = Path(model_path)
    if model_path.suffix != ".model":
        raise ValueError(f"tokenizer model_path must end in .model, got {model_path}")
    if model_path.is_file():
        tok = Tokenizer.load(model_path)
        if tok.vocab_size != vocab_size:
            logger.warning("tokenizer %s has vocab %d, config asks %d; using the file", model_path, tok.vocab_size, vocab_size)
        return tok
    logger.warning("tokenizer %s does not exist: training a new %d-piece tokenizer there from the training data "
                   "(the run's token ids come from it; to use an existing tokenizer, point [tokenizer].model_path "
                   "at its .model file)", model_path, vocab_size)
    return train_tokenizer(train_inputs, model_path.with_suffix(""), vocab_size, **kwargs)
