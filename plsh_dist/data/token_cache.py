"""Tokenised corpus on disk: one flat token stream, memory-mapped.

Layout of the stream (N tokens): ``doc_0 EOS doc_1 EOS ... doc_k EOS`` in the
source's order. Packing into windows happens on the fly from this stream
(``packing.py``), so one cache serves every ``seq_len`` (training at 2k and
evaluating at 16k reuse it).

The cache directory is keyed by a hash of everything that changes the tokens:
the tokenizer model bytes, the source (file paths, sizes and mtimes, or the
dataset name), the text field, the minimum document length. A cache is used
only if its ``meta.json`` matches the key and the token file has the recorded
length and CRC32; anything else (a crash mid-write, a truncated copy, a
flipped byte) is logged and rebuilt. Files are written under a temporary name
and renamed, with ``meta.json`` last, so a reader never sees a half cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from plsh_dist.data.report import BadDataReport
from plsh_dist.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1
_ENCODE_BATCH = 64  # documents per SentencePiece batch call
_CRC_CHUNK = 1 << 24


@dataclass(frozen=True)
class TokenStream:
    """A cached token stream.

    Attributes:
        tokens: (N,) uint16/uint32 memmap; every document is followed by EOS.
        num_docs: documents in the stream (= number of EOS tokens).
        eos_id: the end-of-document id used.
        report: what was kept and skipped while building.
        path: the cache directory.
    """

    tokens: np.ndarray
    num_docs: int
    eos_id: int
    report: BadDataReport
    path: Path

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


def cache_key(tokenizer: Tokenizer, source: dict, min_doc_tokens: int) -> str:
    """Hex key of the cache for this tokenizer, source description and filter."""
    payload = json.dumps(
        {"format": _FORMAT_VERSION, "tokenizer": tokenizer.fingerprint, "source": source, "min_doc_tokens": min_doc_tokens},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _crc32_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def build_token_stream(
    documents: Iterable[str] | Iterable[tuple[str, str]],
    tokenizer: Tokenizer,
    out_dir: str | os.PathLike,
    key: str,
    min_doc_tokens: int,
    report: BadDataReport | None = None,
) -> TokenStream:
    """Tokenise ``documents`` into ``out_dir`` (tokens.bin + meta.json) and open it.

    ``documents`` yields texts, or ``(text, where)`` pairs whose ``where``
    names a skipped document in the report.

    Documents with fewer than ``min_doc_tokens`` tokens are counted as
    ``short`` and left out. ``report`` carries the counts of earlier stages
    (files, records) and is stored in meta.json.
    """
    report = BadDataReport() if report is None else report
    out = Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    bin_path, meta_path = out / "tokens.bin", out / "meta.json"
    meta_path.unlink(missing_ok=True)  # invalidate first: a crash below must not leave an old meta pointing at new tokens
    tmp = bin_path.with_name("tokens.bin.tmp")
    num_tokens = num_docs = crc = 0
    doc_index = 0

    def flush(batch: list, f) -> None:
        nonlocal num_tokens, num_docs, crc, doc_index
        texts = [d if isinstance(d, str) else d[0] for d in batch]
        for doc, ids in zip(batch, tokenizer.encode_batch(texts)):
            doc_index += 1
            if len(ids) < min_doc_tokens:
                where = f"document {doc_index - 1}" if isinstance(doc, str) else doc[1]
                report.skip("short", f"{where} ({len(ids)} tokens < min_doc_tokens={min_doc_tokens})")
                continue
            chunk = np.concatenate([np.asarray(ids, dtype=dtype), eos]).tobytes()
            f.write(chunk)
            crc = zlib.crc32(chunk, crc)
            num_tokens += len(ids) + 1
            num_docs += 1

    try:
        with open(tmp, "wb") as f:
            batch: list = []
            for text in documents:  # the source raises ValueError for unusable data (e.g. only empty files)
                batch.append(text)
                if len(batch) == _ENCODE_BATCH:
                    flush(batch, f)
                    batch = []
            if batch:
                flush(batch, f)
        if num_docs == 0:
            raise ValueError(f"no document survived the checks; {report.summary('data')}")
    except BaseException:  # a failed build leaves nothing behind: no tmp file, no empty cache dir
        tmp.unlink(missing_ok=True)
        if created:
            try:
                out.rmdir()
            except OSError:  # not empty: something else lives there
                pass
        raise
    report.kept += num_docs
    os.replace(tmp, bin_path)
    meta = {
        "format": _FORMAT_VERSION, "key": key, "dtype": np.dtype(dtype).name, "num_tokens": num_tokens,
        "num_docs": num_docs, "eos_id": tokenizer.eos_id, "crc32": crc, "report": report.to_dict(),
    }
    tmp_meta = meta_path.with_name("meta.json.tmp")
    tmp_meta.write_text(json.dumps(meta, indent=1))
    os.replace(tmp_meta, meta_path)
    return open_token_stream(out, key)


def open_token_stream(cache_dir: str | os.PathLike, key: str, verify: bool = True) -> TokenStream:
    """Open a cache; ValueError saying what is wrong if it is missing, stale or corrupt.

    ``verify`` recomputes the CRC32 of the tokens (about 1 s per GB).
    """
    cache = Path(cache_dir)
    meta_path, bin_path = cache / "meta.json", cache / "tokens.bin"
    if not meta_path.is_file() or not bin_path.is_file():
        raise ValueError(f"token cache {cache} is missing meta.json or tokens.bin")
    try:
        meta = json.loads(meta_path.read_text())
        dtype = np.dtype(meta["dtype"])
        n = int(meta["num_tokens"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"token cache {cache} has an unreadable meta.json ({e})") from e
    if meta.get("format") != _FORMAT_VERSION or meta.get("key") != key:
        raise ValueError(f"token cache {cache} belongs to another tokenizer/source (key {meta.get('key')} != {key})")
    if bin_path.stat().st_size != n * dtype.itemsize:
        raise ValueError(f"token cache {cache}: tokens.bin has {bin_path.stat().st_size} bytes, expected {n * dtype.itemsize}")
    if verify and _crc32_of(bin_path) != meta["crc32"]:
        raise ValueError(f"token cache {cache}: tokens.bin CRC32 mismatch (corrupted file)")
    tokens = np.memmap(bin_path, dtype=dtype, mode="r", shape=(n,))
    return TokenStream(tokens, int(meta["num_docs"]), int(meta["eos_id"]), BadDataReport.from_dict(meta["report"]), cache)


def load_or_build_token_stream(
    documents_factory,
    tokenizer: Tokenizer,
    cache_root: str | os.PathLike,
    source: dict,
    min_doc_tokens: int,
    report: BadDataReport | None = None,
    verify: bool = True,
) -> TokenStream:
    """Open the cache for (tokenizer, source, min_doc_tokens) or build it.

    Args:
        documents_factory: ``callable(report) -> Iterable[str | (str, where)]`` returning the
            documents and counting skipped records in ``report``; called only
            when the cache must be (re)built, so a warm start never reads the
            raw data.
        cache_root: directory holding one sub-directory per key.
        source: JSON-serialisable description of the data (see ``cache_key``).
        report: filled with the skip counts of the build, or of the cached build.

    In multi-process runs call this on one rank per node first (then barrier):
    concurrent builders are safe (atomic renames) but waste time.
    """
    key = cache_key(tokenizer, source, min_doc_tokens)
    cache = Path(cache_root) / key
    if (cache / "meta.json").exists():
        try:
            stream = open_token_stream(cache, key, verify=verify)
            if report is not None:
                report.merge(stream.report)
            logger.info("token cache hit %s: %d tokens, %d documents", cache, stream.num_tokens, stream.num_docs)
            return stream
        except ValueError as e:
            logger.warning("rebuilding token cache: %s", e)
    build_report = BadDataReport()
    stream = build_token_stream(documents_factory(build_report), tokenizer, cache, key, min_doc_tokens, build_report)
    build_report.log(logger, f"token cache {cache}")
    if report is not None:
        report.merge(build_report)
    return stream
