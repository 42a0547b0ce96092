"""The embedded default corpus (the running interpreter's standard library) and an
English-prose corpus from a Debian package (the Jargon File).

The stdlib is on every machine with Python, needs no network, and its files are long documents
with long-range structure. Files are decoded as Python decodes source (broken and empty files are
reported and skipped); the train/validation split is a pure function of (seed, relative path)
(BLAKE2b). :func:`write_prose_corpus` cuts the Jargon File (``apt-get install jargon-text``) into
long documents; both are written as ``train.jsonl`` / ``val.jsonl``. Why these corpora and how the
documents are cut: docs/training.md, "The embedded corpora".
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import re
import sys
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path

from plsh_dist.data.report import BadDataReport

#: Where Debian's ``jargon-text`` package puts the Jargon File.
JARGON_FILE = "/usr/share/doc/jargon-text/jargon.txt.gz"
#: The Debian package that ships it.
JARGON_PACKAGE = "jargon-text"

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1
# Third-party packages live under the stdlib directory on most installs; they
# are not part of the standard library and differ between machines.
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class CorpusStats:
    """What went into the corpus.

    Attributes:
        train_docs / val_docs: documents written to each file.
        train_chars / val_chars: characters of text in each file.
        report: files skipped (empty, undecodable), with examples.
    """

    train_docs: int
    val_docs: int
    train_chars: int
    val_chars: int
    report: BadDataReport


@dataclass(frozen=True)
class CorpusFiles:
    """Paths of the written JSONL files (one ``{"text", "source"}`` object per line)."""

    train: Path
    val: Path
    stats: CorpusStats


def stdlib_root() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_stdlib_files(root: Path | None = None) -> list[str]:
    """Sorted POSIX relative paths of every ``.py`` file under the stdlib root."""
    root = stdlib_root() if root is None else Path(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place so os.walk never descends into third-party trees.
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                found.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(found)


def stable_unit_hash(seed: int, key: str) -> float:
    """A float in [0, 1) from BLAKE2b(seed, key): identical on every machine and run."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def _decode_source(data: bytes) -> str:
    """Decode Python source like the interpreter does (coding cookie, BOM); raises on bad bytes."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


def _choose_files(files: list[str], val_fraction: float, max_files: int | None, seed: int) -> tuple[list[str], list[str]]:
    """Deterministic (train, val) relative paths, both sorted."""
    if max_files is not None:
        # Take the files with the smallest hashes rather than the first ones
        # alphabetically: a small corpus then still spans the whole library.
        files = sorted(sorted(files, key=lambda f: stable_unit_hash(seed + 1, f))[:max_files])
    val = [f for f in files if stable_unit_hash(seed, f) < val_fraction]
    if val_fraction > 0 and not val and len(files) >= 2:
        # Tiny corpora may hash no file below the fraction; keep validation non-empty.
        val = [min(files, key=lambda f: stable_unit_hash(seed, f))]
    val_set = set(val)
    return [f for f in files if f not in val_set], val


def _manifest(root: Path, train: list[str], val: list[str], seed: int) -> dict:
    """Everything the output depends on; identical manifest -> identical files."""
    content = hashlib.blake2b(digest_size=16)
    for side, rels in (("train", train), ("val", val)):
        content.update(side.encode() + b"\x00")
        for rel in rels:
            content.update(rel.encode("utf-8") + b"\x00")
            content.update(hashlib.blake2b((root / rel).read_bytes(), digest_size=16).digest())
    return {
        "format": _FORMAT_VERSION,
        "python": sys.version.split()[0],
        "seed": seed,
        "num_train_files": len(train),
        "num_val_files": len(val),
        "content_hash": content.hexdigest(),
    }


def _write_jsonl(root: Path, rels: list[str], path: Path, report: BadDataReport) -> tuple[int, int]:
    """Write one JSONL file atomically; returns (documents, characters)."""
    docs = chars = 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for rel in rels:
            data = (root / rel).read_bytes()
            try:
                text = _decode_source(data)
            except (SyntaxError, UnicodeDecodeError, LookupError):
                # SyntaxError: invalid coding cookie; LookupError: unknown codec name.
                report.skip("undecodable_file", rel)
                continue
            if not text.strip():
                report.skip("empty_file", rel)
                continue
            out.write(json.dumps({"text": text, "source": rel}, ensure_ascii=False) + "\n")
            docs += 1
            chars += len(text)
    os.replace(tmp, path)
    report.kept += docs
    report.files_read += len(rels)
    return docs, chars


def write_stdlib_corpus(
    out_dir: str | os.PathLike,
    val_fraction: float = 0.02,
    max_files: int | None = None,
    seed: int = 0,
) -> CorpusFiles:
    """Write the stdlib sources as ``train.jsonl`` and ``val.jsonl`` under ``out_dir``.

    Args:
        out_dir: created if missing; holds train.jsonl, val.jsonl, manifest.json.
        val_fraction: expected fraction of files in validation, in [0, 1).
        max_files: use only this many files (chosen by stable hash); None = all.
        seed: changes which files are chosen and which go to validation.

    Idempotent: when ``manifest.json`` matches (same interpreter files, split
    and seed) and both files are intact, the existing files are reused.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if max_files is not None and max_files < 1:
        raise ValueError(f"max_files must be >= 1 or None, got {max_files}")
    root = stdlib_root()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_rel, val_rel = _choose_files(list_stdlib_files(root), val_fraction, max_files, seed)
    manifest = _manifest(root, train_rel, val_rel, seed)
    reused = _reuse(out, manifest, "stdlib corpus")
    if reused is not None:
        return reused
    train_path, val_path = out / "train.jsonl", out / "val.jsonl"
    report = BadDataReport()
    train_docs, train_chars = _write_jsonl(root, train_rel, train_path, report)
    val_docs, val_chars = _write_jsonl(root, val_rel, val_path, report)
    stats = CorpusStats(train_docs, val_docs, train_chars, val_chars, report)
    report.log(logger, f"stdlib corpus ({root})")
    return _publish(out, manifest, stats)


def _reuse(out: Path, inputs: dict, what: str) -> CorpusFiles | None:
    """The corpus in ``out`` if its manifest records ``inputs`` and both files are intact, else None."""
    train_path, val_path, manifest_path = out / "train.jsonl", out / "val.jsonl", out / "manifest.json"
    if not manifest_path.exists():
        return None
    try:
        saved = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        return None
    if not (saved.get("inputs") == inputs and train_path.exists() and val_path.exists()
            and train_path.stat().st_size == saved.get("train_bytes")
            and val_path.stat().st_size == saved.get("val_bytes")):
        return None
    stats = CorpusStats(**{k: v for k, v in saved["stats"].items() if k != "report"},
                        report=BadDataReport.from_dict(saved["stats"]["report"]))
    logger.info("reusing %s in %s (%d train / %d val documents)", what, out, stats.train_docs, stats.val_docs)
    return CorpusFiles(train=train_path, val=val_path, stats=stats)


def _publish(out: Path, inputs: dict, stats: CorpusStats) -> CorpusFiles:
    """Write the manifest of the freshly written ``train.jsonl`` / ``val.jsonl`` in ``out``.

    Written last: a crash before this point leaves no manifest, so the next call rewrites."""
    train_path, val_path, manifest_path = out / "train.jsonl", out / "val.jsonl", out / "manifest.json"
    saved = {
        "inputs": inputs,
        "train_bytes": train_path.stat().st_size,
        "val_bytes": val_path.stat().st_size,
        "stats": {"train_docs": stats.train_docs, "val_docs": stats.val_docs, "train_chars": stats.train_chars,
                  "val_chars": stats.val_chars, "report": stats.report.to_dict()},
    }
    tmp = manifest_path.with_name("manifest.json.tmp")
    tmp.write_text(json.dumps(saved, indent=1))
    os.replace(tmp, manifest_path)
    return CorpusFiles(train=train_path, val=val_path, stats=stats)


# ---------------------------------------------------------------------------
# English prose: the Jargon File (Debian package jargon-text).
# ---------------------------------------------------------------------------

_PROSE_FORMAT_VERSION = 1
# Headings sit at column 0; the file puts a no-break space after "Chapter" / "Appendix".
_SECTION = re.compile(r"^(Chapter\s\d+\.|Appendix\s[A-Z]\.|Glossary$|Bibliography$)")
_ENTRY = re.compile(r"^ {3}:([^:]+):")


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8")


def _tidy(lines: list[str]) -> str:
    """Drop the file's 3-space body indent (deeper indents keep the rest), strip trailing
    spaces, at most one blank line in a row."""
    text = "\n".join(re.sub(r"^ {1,3}", "", line.rstrip()) for line in lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def jargon_documents(text: str, chunk_chars: int = 16_000) -> list[tuple[str, str]]:
    """``[(key, text)]`` of the Jargon File's plain text, in file order (see module doc).

    Keys: ``chapter-N``, ``appendix-X``, ``bibliography`` and
    ``lexicon-NNN-<first headword>`` for the lexicon's runs of entries.
    Raises ValueError if the text does not look like the Jargon File (no
    sections or no lexicon entries): a changed package must not silently
    give an empty or garbled corpus.
    """
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if _SECTION.match(line):
            sections.append((line.strip(), [line]))
        elif sections:
            sections[-1][1].append(line)
    docs: list[tuple[str, str]] = []
    for title, lines in sections:
        if title == "Glossary":
            starts = [i for i, line in enumerate(lines) if _ENTRY.match(line)]
            if not starts:
                raise ValueError("the Jargon File's Glossary has no ':entry:' lines; is this the jargon-text file?")
            chunk: list[str] = []
            first = None
            bounds = starts + [len(lines)]
            for a, b in zip(bounds, bounds[1:]):
                if first is None:
                    first = _ENTRY.match(lines[a]).group(1).strip()
                chunk += lines[a:b]
                if sum(len(x) + 1 for x in chunk) >= chunk_chars or b == len(lines):
                    slug = re.sub(r"[^A-Za-z0-9]+", "_", first).strip("_")[:24] or "x"
                    docs.append((f"lexicon-{len([d for d in docs if d[0].startswith('lexicon')]):03d}-{slug}",
                                 _tidy(chunk)))
                    chunk, first = [], None
        else:
            key = re.sub(r"\s+", "-", title.split(".")[0].strip().lower())
            docs.append((key, _tidy(lines)))
    if not any(k.startswith("chapter") for k, _ in docs) or not any(k.startswith("lexicon") for k, _ in docs):
        raise ValueError("text does not look like the Jargon File (no 'Chapter N.' sections or no lexicon entries)")
    return docs


def write_prose_corpus(out_dir: str | os.PathLike, source: str | os.PathLike | None = None,
                       val_fraction: float = 0.1, seed: int = 0, chunk_chars: int = 16_000) -> CorpusFiles:
    """Write the Jargon File as ``train.jsonl`` / ``val.jsonl`` (+ ``manifest.json``) under ``out_dir``.

    Args:
        source: the Jargon File (``.txt`` or ``.txt.gz``); None = :data:`JARGON_FILE`.
        val_fraction: expected fraction of documents held out, in [0, 1)
            (a stable hash of the document key; at least one lexicon document).
        seed: changes which documents go to validation.
        chunk_chars: characters per lexicon document (runs of whole entries).

    Idempotent like :func:`write_stdlib_corpus`. Raises ValueError naming the
    package and the install command when the file is missing.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    path = Path(JARGON_FILE if source is None else source)
    if not path.is_file():
        raise ValueError(
            f"the prose corpus needs the Jargon File at {str(path)!r}: install Debian's {JARGON_PACKAGE} package "
            f"(apt-get install {JARGON_PACKAGE}), or pass its jargon.txt.gz with --source (e.g. unpacked from "
            f"'apt-get download {JARGON_PACKAGE}' with 'dpkg-deb -x')")
    raw = path.read_bytes()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = {"format": _PROSE_FORMAT_VERSION, "source": "jargon-file", "source_blake2b":
              hashlib.blake2b(raw, digest_size=16).hexdigest(), "seed": seed, "val_fraction": val_fraction,
              "chunk_chars": chunk_chars}
    reused = _reuse(out, inputs, "prose corpus")
    if reused is not None:
        return reused
    train_path, val_path = out / "train.jsonl", out / "val.jsonl"
    docs = jargon_documents(_read_text(path), chunk_chars)
    val_keys = {k for k, _ in docs if stable_unit_hash(seed, k) < val_fraction}
    lexicon = [k for k, _ in docs if k.startswith("lexicon")]
    if val_fraction > 0 and not val_keys & set(lexicon):
        val_keys.add(min(lexicon, key=lambda k: stable_unit_hash(seed, k)))
    counts = {}
    for side, target in (("train", train_path), ("val", val_path)):
        tmp = target.with_name(target.name + ".tmp")
        n = chars = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for key, text in docs:
                if (key in val_keys) == (side == "val"):
                    f.write(json.dumps({"text": text, "source": f"jargon/{key}"}, ensure_ascii=False) + "\n")
                    n, chars = n + 1, chars + len(text)
        os.replace(tmp, target)
        counts[side] = (n, chars)
    report = BadDataReport()
    report.files_read, report.kept = 1, len(docs)
    stats = CorpusStats(counts["train"][0], counts["val"][0], counts["train"][1], counts["val"][1], report)
    return _publish(out, inputs, stats)
