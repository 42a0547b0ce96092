"""Where documents come from: local files, any ``datasets.load_dataset`` name, or a ``save_to_disk`` directory.

Local JSON-lines / JSON and parquet files are read with the ``datasets`` builder
their extension asks for; a plain-text file (any other extension) by
``text_reader.read_text_documents``, in chunks, so a file larger than memory
streams. A text file is one document (``sample_by="document"`` by default:
source files and books are long documents, not lines), or the text between two
``doc_separator``, or a paragraph, or a line. (A compressed text file still goes
to the ``datasets`` text builder, which decompresses it.)

Before any reader sees a local text or JSON-lines file we check it: empty
files and binary files (a NUL byte in the first MiB, the test git uses) are
reported and left out, and so are files with bytes that are not UTF-8, except
text files under ``decode_errors="replace"``, whose bad bytes the reader
replaces by U+FFFD and counts per file (``BadDataReport.replaced``).
(``datasets`` aborts the whole load on the first bad byte, so this check is
what turns one broken file into a counted skip rather than a crash.)
Record-level problems (a text field that is missing, None, a number, empty)
are counted while iterating.

A ``dataset_name`` that is a directory written by ``Dataset.save_to_disk`` or
``DatasetDict.save_to_disk`` (``load_dataset`` refuses the first and asks for
``load_from_disk``) is read with ``datasets.load_from_disk``: a ``DatasetDict``'s
split by name, a ``Dataset`` as the one split ``train``.
"""

from __future__ import annotations

import codecs
import glob
import itertools
import logging
import os
from pathlib import Path
from typing import Iterator, Sequence

from plsh_dist.data.report import BadDataReport
from plsh_dist.data.text_reader import ReplacedBytes, read_text_documents

logger = logging.getLogger(__name__)

# Extension (after stripping a compression suffix) -> datasets builder.
# Anything not listed is read as plain text: source trees have many extensions.
BUILDER_BY_EXTENSION = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
_COMPRESSION = {".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip"}
_CHECK_CHUNK = 1 << 20  # bytes per read when checking UTF-8; bounded memory on big files
#: What a text file's bytes that are not UTF-8 do: "replace" (by U+FFFD, counted) or "skip_file".
DECODE_ERRORS = ("replace", "skip_file")


def resolve_files(patterns: str | Sequence[str]) -> list[Path]:
    """Expand paths and globs (``**`` recursive) to a sorted, de-duplicated file list.

    Raises ValueError naming the pattern when one matches no file: a typo in a
    data path must not silently train on less data. A directory is not a
    data file: the error says so (and whether it is empty) and gives a glob.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    found: set[Path] = set()
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matches = [Path(m) for m in glob.glob(pattern, recursive=True)]
        files = [m for m in matches if m.is_file()]
        if not files:
            raise ValueError(f"data file pattern {pattern!r} matches no file{_why_no_file(pattern, matches)}")
        found.update(m.resolve() for m in files)
    return sorted(found)


def _why_no_file(pattern: str, matches: list[Path]) -> str:
    """Why ``pattern`` matched no file, and the fix (the tail of ``resolve_files``'s error)."""
    dirs = [m for m in matches if m.is_dir()]
    if dirs and any(p.is_file() for p in dirs[0].rglob("*")):
        example = os.path.join(str(dirs[0]), "**", "*.txt")
        return f": {str(dirs[0])!r} is a directory; name its files with a glob, e.g. {example!r}"
    if dirs:
        base = dirs[0]
    elif glob.has_magic(pattern):  # the directory the glob starts from: its parts before the first wildcard
        base = Path(*itertools.takewhile(lambda p: not glob.has_magic(p), Path(pattern).parts))
    else:
        base = Path(pattern).parent
    if base.is_dir() and not any(p.is_file() for p in base.rglob("*")):
        return f": {str(base)!r} is an empty directory; put the data files there or point at another path"
    return "; check the path or glob (relative paths start at the working directory)"


def _extension(path: Path) -> tuple[str, bool]:
    """(extension without compression suffix, whether compressed)."""
    suffixes = [s.lower() for s in path.suffixes]
    compressed = bool(suffixes) and suffixes[-1] in _COMPRESSION
    if compressed:
        suffixes = suffixes[:-1]
    return (suffixes[-1] if suffixes else ""), compressed


def is_text_file(path: Path) -> bool:
    """Whether ``path`` is read as plain text (``sample_by``, ``doc_separator`` and ``decode_errors`` apply)."""
    return BUILDER_BY_EXTENSION.get(_extension(path)[0], "text") == "text"


def builder_for(paths: Sequence[Path]) -> str:
    """The one datasets builder for all files; ValueError if they need different ones."""
    builders = {BUILDER_BY_EXTENSION.get(_extension(p)[0], "text") for p in paths}
    if len(builders) != 1:
        raise ValueError(
            f"data files mix formats that need different readers ({sorted(builders)}); "
            "pass one kind of file (text, jsonl/json or parquet) per split"
        )
    return builders.pop()


def _file_problem(path: Path, errors: str = "strict") -> str | None:
    """'empty_file', 'binary_file', 'undecodable_file' or None for a local UTF-8 text/JSON file.

    ``errors="replace"``: bytes that are not UTF-8 are no problem (the reader replaces them).
    """
    if path.stat().st_size == 0:
        return "empty_file"
    decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)
    blank = True
    with open(path, "rb") as f:
        first = True
        try:
            while chunk := f.read(_CHECK_CHUNK):
                if first and b"\x00" in chunk:
                    # NUL is valid UTF-8 but never in text: images, archives, weights.
                    return "binary_file"
                first = False
                text = decoder.decode(chunk)
                blank = blank and not text.strip()
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return "undecodable_file"
    return "empty_file" if blank else None


def check_local_files(paths: Sequence[Path], builder: str, report: BadDataReport,
                      decode_errors: str = "replace") -> list[Path]:
    """Drop (and count) empty, binary and non-UTF-8 files; returns the usable ones.

    Every file counts in ``report.files_read``. Parquet is validated by Arrow
    itself and compressed files cannot be checked without decompressing, so
    only their emptiness is checked. ``decode_errors="replace"`` keeps text
    files with bytes that are not UTF-8 (the text reader replaces them).
    """
    usable = []
    report.files_read += len(paths)
    errors = "replace" if builder == "text" and decode_errors == "replace" else "strict"
    for path in paths:
        if builder == "parquet" or _extension(path)[1]:
            problem = "empty_file" if path.stat().st_size == 0 else None
        else:
            problem = _file_problem(path, errors)
        if problem:
            report.skip(problem, str(path))
        else:
            usable.append(path)
    return usable


def saved_dataset_dir(name: str | None) -> Path | None:
    """``name`` as a directory written by ``Dataset.save_to_disk`` (``state.json`` and
    ``dataset_info.json``) or ``DatasetDict.save_to_disk`` (``dataset_dict.json``); None otherwise."""
    if not name:
        return None
    path = Path(name).expanduser()
    if (path / "dataset_dict.json").is_file() or ((path / "state.json").is_file()
                                                  and (path / "dataset_info.json").is_file()):
        return path
    return None


def _load_saved(path: Path, split: str, dataset_config: str | None, data_files: Sequence[str] | None):
    """The ``split`` of a ``save_to_disk`` directory (module doc); ValueError naming the splits it has."""
    import datasets

    if dataset_config or data_files:
        raise ValueError(f"[data].dataset_name = {str(path)!r} is a save_to_disk directory, read whole with "
                         f"datasets.load_from_disk: unset [data].dataset_config and [data].data_files")
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"split {split!r} is not in the save_to_disk directory {path}: its splits are "
                             f"{sorted(ds)}; set [data].train_split / [data].val_split to one of them")
        return ds[split]
    if split != "train":
        raise ValueError(f"{path} holds one Dataset (Dataset.save_to_disk), read as split 'train', so it has no "
                         f"split {split!r}: unset [data].val_split (or set [data].train_split = 'train'), or save a "
                         f"DatasetDict with that split")
    return ds


def iter_documents(
    files: Sequence[str] | str | None = None,
    *,
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    split: str = "train",
    text_field: str = "text",
    streaming: bool = True,
    sample_by: str = "document",
    doc_separator: str | None = None,
    decode_errors: str = "replace",
    hf_cache_dir: str | None = None,
    report: BadDataReport | None = None,
    with_location: bool = False,
    data_files: Sequence[str] | None = None,
) -> Iterator[str] | Iterator[tuple[str, str]]:
    """Yield the text of every usable document, in a deterministic order.

    Exactly one of ``files`` (paths/globs) and ``dataset_name`` (anything
    ``datasets.load_dataset`` accepts, needing network unless cached, or a
    ``save_to_disk`` directory: module doc) is given.
    Skipped items are counted in ``report`` (created if None); ``report.kept``
    is not touched here because length checks happen after tokenising.
    With ``with_location`` it yields ``(text, where)``: the record's ``source``
    field when it has one (the stdlib corpus does), else ``"<origin> record i"``.
    Every skipped record, and every location, names its origin: a local record its
    own file (``"data/b.jsonl record 98"``, ``i`` counted from 0 in that file), a
    dataset's its name (and split), ``i`` counted in the split.
    ``data_files``: with ``dataset_name``, the ``data_files`` of ``load_dataset`` (a file builder
    such as ``json``), as paths/globs; they go as one ``train`` split.
    ``sample_by``, ``doc_separator`` and ``decode_errors`` (``[data]``'s, ``DataConfig``) apply to local
    plain-text files: what a document is, and what bytes that are not UTF-8 do ("replace": U+FFFD,
    counted per file in ``report.replaced``; "skip_file": the file is skipped as ``undecodable_file``).
    """
    import datasets  # deferred: importing datasets costs ~1 s and is not needed for packing

    if (files is None) == (dataset_name is None):
        raise ValueError("give exactly one of files (local paths/globs) or dataset_name")
    if sample_by not in ("document", "line", "paragraph"):
        raise ValueError(f"sample_by must be 'document', 'line' or 'paragraph', got {sample_by!r}")
    if doc_separator is not None and (sample_by != "document" or not doc_separator):
        raise ValueError(f"doc_separator={doc_separator!r} needs a non-empty separator and sample_by='document' "
                         f"(got {sample_by!r})")
    if decode_errors not in DECODE_ERRORS:
        raise ValueError(f"decode_errors must be one of {DECODE_ERRORS}, got {decode_errors!r}")
    report = BadDataReport() if report is None else report

    if files is not None:
        paths = resolve_files(files)
        builder = builder_for(paths)
        paths = check_local_files(paths, builder, report, decode_errors)
        if not paths:
            raise ValueError(f"no usable data file among {files!r}; {report.summary('files')}")
        kwargs = {"sample_by": sample_by} if builder == "text" else {}

        def records(path: Path):
            if builder == "text" and not _extension(path)[1]:
                return _text_records(path, text_field, sample_by, doc_separator, decode_errors, report)
            return datasets.load_dataset(builder, data_files=[str(path)], split="train", streaming=streaming,
                                         cache_dir=hf_cache_dir, **kwargs)

        # One file at a time, in order (the documents and their order are those of one load of every
        # file), so that a skipped record is named by its own file: a load of several files numbers
        # its records across them and cannot tell which file one came from.
        parts = ((records(p), str(p)) for p in paths)
    elif (saved := saved_dataset_dir(dataset_name)) is not None:
        parts = [(_load_saved(saved, split, dataset_config, data_files), f"{saved} (split {split!r})")]
    else:
        extra = {"data_files": [str(p) for p in resolve_files(list(data_files))]} if data_files else {}
        parts = [(datasets.load_dataset(dataset_name, dataset_config, split=split, streaming=streaming,
                                        cache_dir=hf_cache_dir, **extra), dataset_name)]

    for ds, where in parts:
        for i, record in enumerate(ds):
            text = record.get(text_field)
            if not isinstance(text, str):
                report.skip("non_string", f"{where} record {i} ({text_field}={type(text).__name__})")
            elif not text.strip():
                report.skip("empty", f"{where} record {i}")
            elif with_location:
                source = record.get("source")
                yield text, (source if isinstance(source, str) else f"{where} record {i}")
            else:
                yield text


def _text_records(path: Path, text_field: str, sample_by: str, doc_separator: str | None, decode_errors: str,
                  report: BadDataReport) -> Iterator[dict]:
    """A text file's documents as records ``{text_field: text}``; its replaced bytes in ``report`` at its end."""
    replaced = ReplacedBytes()
    errors = "replace" if decode_errors == "replace" else "strict"  # "skip_file": the check left only UTF-8 files
    for text in read_text_documents(path, sample_by, doc_separator, errors, replaced):
        yield {text_field: text}
    if replaced.bytes:
        report.add_replaced(str(path), replaced.bytes, replaced.offsets)
