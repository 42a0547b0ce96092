"""Plain-text files read in chunks, documents yielded as they complete.

A text file is decoded 1 MiB at a time and cut into documents by
``sample_by`` (``[data].sample_by``):

- ``"document"``: the whole file, or with ``doc_separator`` the text between
  two separators (the separator itself dropped, the text kept as it is);
- ``"paragraph"``: the text between blank lines (``"\\n\\n"``);
- ``"line"``: each line, without its newline.

So memory holds one document at a time (and one chunk), never the file:
a 1 GB file of lines or of separated documents is read in the memory its
largest document needs. Only ``"document"`` without a separator holds the
whole file, as the one document it is.

The documents equal what ``datasets``' ``text`` builder gave before this
reader (the same newline translation: ``"\\r\\n"`` and ``"\\r"`` read as
``"\\n"``; in ``"line"`` an empty line is an (empty) record and a final
newline ends the last line; in ``"paragraph"`` empty paragraphs are none).
That builder reads a line (and a document) whole, however long: a 23 MB
one-line file doubled the peak memory.

Bytes that are not UTF-8 (``decode_errors="replace"``) become U+FFFD, one
per invalid sequence, as Python's ``errors="replace"`` makes them; a
``ReplacedBytes`` counts them and keeps the first byte offsets.
"""

from __future__ import annotations

import codecs
import contextvars
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

READ_CHUNK = 1 << 20  # bytes per read: bounds the memory a read takes besides the document being built
MAX_OFFSETS = 5  # byte offsets kept per file, the first ones
_COUNTED_REPLACE = "plsh_dist.replace_counted"  # the codec error handler registered below


@dataclass
class ReplacedBytes:
    """Undecodable bytes replaced by U+FFFD in one file: how many, and where the first ones start."""

    bytes: int = 0
    offsets: list[int] = field(default_factory=list)
    """Byte offsets in the file (from 0) of the first ``MAX_OFFSETS`` invalid sequences."""
    _base: int = 0  # file offset of the decoder's current input (its held-back bytes, then the chunk)

    def _add(self, start: int, end: int) -> None:
        self.bytes += end - start
        if len(self.offsets) < MAX_OFFSETS:
            self.offsets.append(self._base + start)


_tally: contextvars.ContextVar[ReplacedBytes] = contextvars.ContextVar("plsh_dist_replaced_bytes")


def _replace_counted(exc: UnicodeError) -> tuple[str, int]:
    """``errors="replace"`` for decoding, counted in the ``ReplacedBytes`` of the decode in progress.

    A codec error handler (not a strict decode and a retry) so that the C
    decoder runs on: one exception object per chunk, however many bad bytes.
    """
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    _tally.get()._add(exc.start, exc.end)
    return "\ufffd", exc.end


codecs.register_error(_COUNTED_REPLACE, _replace_counted)


def decoded_chunks(path: str | Path, decode_errors: str = "replace",
                   replaced: ReplacedBytes | None = None) -> Iterator[str]:
    """The text of ``path`` in pieces of about ``READ_CHUNK`` characters, newlines translated.

    ``decode_errors``: "replace" (counted in ``replaced``) or "strict" (a
    ``UnicodeDecodeError`` on the first bad byte).
    """
    replaced = ReplacedBytes() if replaced is None else replaced
    utf8 = codecs.getincrementaldecoder("utf-8")(_COUNTED_REPLACE if decode_errors == "replace" else "strict")
    # What text mode's universal newlines do ("\r\n", "\r" -> "\n"), a "\r" at a chunk's end held back.
    decoder = io.IncrementalNewlineDecoder(utf8, translate=True)
    offset = 0

    def decode(data: bytes, final: bool = False) -> str:
        replaced._base = offset - len(utf8.getstate()[0])  # bytes held back from the last chunk come first
        token = _tally.set(replaced)
        try:
            return decoder.decode(data, final=final)
        finally:
            _tally.reset(token)

    with open(path, "rb") as f:
        while data := f.read(READ_CHUNK):
            text = decode(data)
            offset += len(data)
            if text:
                yield text
        if text := decode(b"", final=True):
            yield text


def split_stream(chunks: Iterator[str], sep: str) -> Iterator[str]:
    """``"".join(chunks).split(sep)``, one piece at a time, never joining more than a piece.

    A separator may straddle two chunks: the last ``len(sep) - 1`` characters
    of a chunk wait for the next. The pieces are ``str.split``'s (leftmost
    matches first, so ``"\\n\\n\\n"`` splits as ``["", "\\n"]``), since a match
    found in the text read so far can never be one a longer text would
    place elsewhere.
    """
    keep = len(sep) - 1
    pending: list[str] = []  # the current piece so far
    carry = ""  # the last keep characters: maybe the start of a separator
    for chunk in chunks:
        *done, rest = (carry + chunk).split(sep)
        for piece in done:
            pending.append(piece)
            yield "".join(pending)
            pending = []
        cut = max(len(rest) - keep, 0)
        if cut:
            pending.append(rest[:cut])
        carry = rest[cut:]
    pending.append(carry)
    yield "".join(pending)


def read_text_documents(path: str | Path, sample_by: str = "document", doc_separator: str | None = None,
                        decode_errors: str = "replace", replaced: ReplacedBytes | None = None) -> Iterator[str]:
    """The documents of one text file, in order (module doc), read in chunks.

    ``doc_separator`` goes with ``sample_by="document"`` only. Undecodable bytes
    are counted in ``replaced`` with ``decode_errors="replace"``, and raise with
    ``"strict"``.
    """
    chunks = decoded_chunks(path, decode_errors, replaced)
    if sample_by == "document" and doc_separator is None:
        yield "".join(chunks)
    elif sample_by == "document":
        # A separator at a file's start or end, or two in a row, makes no document.
        yield from (doc for doc in split_stream(chunks, doc_separator) if doc)
    elif sample_by == "paragraph":
        yield from (doc for doc in split_stream(chunks, "\n\n") if doc)
    elif sample_by == "line":
        previous = None  # a final newline ends the last line: the empty piece after it is no line
        for line in split_stream(chunks, "\n"):
            if previous is not None:
                yield previous
            previous = line
        if previous:
            yield previous
    else:
        raise ValueError(f"sample_by must be 'document', 'paragraph' or 'line', got {sample_by!r}")
