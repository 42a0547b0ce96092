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

A build tokenises chunks of about 4 MB of consecutive documents (SentencePiece's
batch encode on every core: on 2 cores it beat a pool of worker processes,
docs/training.md) into ``<cache>/partial/`` and joins them in order: the
tokens are the same for any number of threads, and an interrupted build
resumes from the chunks it completed (``partial/`` is no cache: no
``meta.json``; it is removed once the cache is published).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from plsh_dist.data.report import BadDataReport
from plsh_dist.data.tokenizer import Tokenizer
from plsh_dist.faults import slow_tokenize
from plsh_dist.progress import LineProgress, progress_bar

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1
CHUNK_BYTES = 4 << 20
"""Text per chunk of a build (UTF-8 bytes): one SentencePiece batch, and the unit of a resume."""
PARTIAL_DIR = "partial"
"""The sub-directory of a cache holding the chunks of a build in progress (``_Chunks``)."""
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
    *,
    threads: int = 1,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
) -> TokenStream:
    """Tokenise ``documents`` into ``out_dir`` (tokens.bin + meta.json) and open it.

    ``documents`` yields texts, or ``(text, where)`` pairs whose ``where``
    names a skipped document in the report.

    Documents with fewer than ``min_doc_tokens`` tokens are counted as
    ``short`` and left out. ``report`` carries the counts of earlier stages
    (files, records) and is stored in meta.json.

    The documents are cut, in order, into chunks of about ``chunk_bytes`` of text; each chunk is
    tokenised by SentencePiece's batch encode on ``threads`` threads into ``partial/`` and the chunks
    are joined in order (the tokens do not depend on ``threads``). A build that was interrupted
    resumes: the chunks ``partial/`` already holds are not tokenised again (the chunk size of the
    interrupted build is kept). ``progress(n)`` is called with the UTF-8 bytes of text each chunk held.
    """
    report = BadDataReport() if report is None else report
    out = Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
    bin_path, meta_path = out / "tokens.bin", out / "meta.json"
    meta_path.unlink(missing_ok=True)  # invalidate first: a crash below must not leave an old meta pointing at new tokens
    tmp = bin_path.with_name("tokens.bin.tmp")
    chunks = _Chunks(out / PARTIAL_DIR, key, np.dtype(dtype).name, chunk_bytes)
    try:
        records = _tokenize_chunks(documents, tokenizer, chunks, min_doc_tokens, threads, progress)
        num_docs = sum(r["kept"] for r in records)
        for r in records:
            report.merge(BadDataReport.from_dict(r["report"]))
        if num_docs == 0:
            raise ValueError(f"no document survived the checks; {report.summary('data')}")
        num_tokens, crc = chunks.join(len(records), tmp)
    except BaseException as exc:  # a failed build leaves no tmp file and no empty cache dir
        tmp.unlink(missing_ok=True)
        if isinstance(exc, ValueError):  # the data was refused: its chunks will not be resumed
            shutil.rmtree(chunks.dir, ignore_errors=True)
        if created:
            try:
                out.rmdir()
            except OSError:  # not empty: the chunks of an interrupted build, kept for the next one
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
    shutil.rmtree(chunks.dir, ignore_errors=True)  # after meta.json: a crash in between only leaves spare chunks
    return open_token_stream(out, key)


class _Chunks:
    """The chunk files of one build: ``partial/build.json`` (key, dtype, chunk size) and per chunk
    ``chunk_<i>.bin`` (its tokens) then ``chunk_<i>.json`` (its record), each written under a
    temporary name and renamed, the record last: a chunk with a record is complete."""

    def __init__(self, directory: Path, key: str, dtype: str, chunk_bytes: int):
        self.dir, self.dtype = directory, np.dtype(dtype)
        manifest = directory / "build.json"
        want = {"format": _FORMAT_VERSION, "key": key, "dtype": dtype}
        try:
            found = json.loads(manifest.read_text())
        except (OSError, ValueError):
            found = None
        if isinstance(found, dict) and {k: found.get(k) for k in want} == want and found.get("chunk_bytes"):
            self.chunk_bytes = int(found["chunk_bytes"])  # resume with the interrupted build's chunks
            self.resumable = True
        else:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            self.chunk_bytes = chunk_bytes
            _write_atomic(manifest, json.dumps({**want, "chunk_bytes": chunk_bytes}).encode())
            self.resumable = False

    def paths(self, index: int) -> tuple[Path, Path]:
        return self.dir / f"chunk_{index:06d}.bin", self.dir / f"chunk_{index:06d}.json"

    def done(self, index: int, docs: int, digest: str) -> dict | None:
        """The record of chunk ``index`` when a previous build completed it from the same documents."""
        if not self.resumable:
            return None
        bin_path, rec_path = self.paths(index)
        try:
            rec = json.loads(rec_path.read_text())
            if (rec["docs"], rec["digest"]) == (docs, digest) and \
                    bin_path.stat().st_size == rec["tokens"] * self.dtype.itemsize:
                return rec
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def join(self, count: int, target: Path) -> tuple[int, int]:
        """Concatenate chunks ``0..count-1`` into ``target``: ``(tokens, CRC32)``."""
        num_tokens = crc = 0
        with open(target, "wb") as f:
            for i in range(count):
                with open(self.paths(i)[0], "rb") as src:
                    while block := src.read(_CRC_CHUNK):
                        f.write(block)
                        crc = zlib.crc32(block, crc)
                        num_tokens += len(block) // self.dtype.itemsize
        return num_tokens, crc


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _document_chunks(documents, chunk_bytes: int) -> Iterator[tuple[list, int, str]]:
    """``(documents, UTF-8 bytes of their text, digest of that text)`` of consecutive documents,
    about ``chunk_bytes`` each."""
    batch, size, digest = [], 0, hashlib.blake2b(digest_size=16)
    for doc in documents:  # the source raises ValueError for unusable data (e.g. only empty files)
        batch.append(doc)
        data = (doc if isinstance(doc, str) else doc[0]).encode("utf-8")
        size += len(data)
        digest.update(len(data).to_bytes(8, "little") + data)
        if size >= chunk_bytes:
            yield batch, size, digest.hexdigest()
            batch, size, digest = [], 0, hashlib.blake2b(digest_size=16)
    if batch:
        yield batch, size, digest.hexdigest()


def _encode_chunk(docs: list, first_doc: int, nbytes: int, digest: str, tokenizer: Tokenizer, min_doc_tokens: int,
                  threads: int, dtype, bin_path: Path, rec_path: Path) -> dict:
    """Tokenise one chunk (SentencePiece's batch encode on ``threads`` threads) into its files
    (``_Chunks``); its record."""
    slow_tokenize()  # off unless a test asks for a slow tokenizer (faults.py)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    texts = [d if isinstance(d, str) else d[0] for d in docs]
    report, parts, kept = BadDataReport(), [], 0
    for i, (doc, ids) in enumerate(zip(docs, tokenizer.encode_batch(texts, num_threads=threads))):
        if len(ids) < min_doc_tokens:
            where = f"document {first_doc + i}" if isinstance(doc, str) else doc[1]
            report.skip("short", f"{where} ({len(ids)} tokens < min_doc_tokens={min_doc_tokens})")
            continue
        parts += [np.asarray(ids, dtype=dtype), eos]
        kept += 1
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    _write_atomic(bin_path, tokens.tobytes())
    rec = {"docs": len(docs), "bytes": nbytes, "digest": digest, "kept": kept, "tokens": int(tokens.shape[0]),
           "report": report.to_dict()}
    _write_atomic(rec_path, json.dumps(rec).encode())
    return rec


def _tokenize_chunks(documents, tokenizer: Tokenizer, chunks: _Chunks, min_doc_tokens: int, threads: int,
                     progress: Callable[[int], None] | None) -> list[dict]:
    """Every chunk's record, in order: reused from ``partial/`` or tokenised now."""
    records: list[dict] = []
    first_doc = reused = 0
    for index, (docs, nbytes, digest) in enumerate(_document_chunks(documents, chunks.chunk_bytes)):
        rec = chunks.done(index, len(docs), digest)
        reused += rec is not None
        if rec is None:
            rec = _encode_chunk(docs, first_doc, nbytes, digest, tokenizer, min_doc_tokens, threads,
                                chunks.dtype.type, *chunks.paths(index))
        records.append(rec)
        first_doc += len(docs)
        if progress is not None:
            progress(nbytes)
    if reused:
        logger.info("resumed the interrupted build in %s: %d of its %d chunks were tokenized already",
                    chunks.dir, reused, len(records))
    return records


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
    *,
    threads: int = 1,
    label: str = "tokens",
    size_bytes: int | None = None,
    status: Callable[[str], None] | None = None,
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
        threads: SentencePiece encoding threads (``build_token_stream``).
        label: what is built, for its progress bar (``tokenizing <label>``).
        size_bytes: the text to tokenise, about (the bar's total; None: unknown).
        status: called with the bar's line as the build advances (for ranks that wait on it).

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
    logger.info("building token cache %s on %d thread(s)", cache, threads)
    bar = progress_bar(size_bytes, f"tokenizing {label}", "B", unit_scale=True)

    def progress(n: int) -> None:
        bar.update(n)
        if status is not None:
            status(bar.line() if isinstance(bar, LineProgress) else str(bar))

    start = time.perf_counter()
    try:
        stream = build_token_stream(documents_factory(build_report), tokenizer, cache, key, min_doc_tokens,
                                    build_report, threads=threads, progress=progress)
    finally:
        bar.close()
    logger.info("built token cache %s: %d tokens, %d documents in %.1f s", cache, stream.num_tokens,
                stream.num_docs, time.perf_counter() - start)
    build_report.log(logger, f"token cache {cache}")
    if report is not None:
        report.merge(build_report)
    return stream
