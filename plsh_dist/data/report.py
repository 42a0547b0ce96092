"""Counting bad data instead of silently using (or silently dropping) it.

Every stage that skips something (an empty file, a binary file, undecodable
bytes, a record whose text field is not a string, a document shorter than the
minimum) calls ``BadDataReport.skip(reason, where)``; the report keeps a count
per reason and the first few locations so the log line says *what* was
skipped and *where*, next to what was read and kept:

    train: read 12 files; kept 9 documents (41,230 tokens); skipped 4: empty_file=1 (e.g. a.txt); ...

When nothing usable remains, the summary also says how to fix each cause.

Bytes that are not UTF-8 in a text file read with ``[data].decode_errors =
"replace"`` skip nothing: they become U+FFFD, and ``add_replaced`` keeps, per
file, how many bytes were replaced and where the first ones are:

    ...; replaced 4 bytes that are not UTF-8 by U+FFFD in 2 files (data/a.txt: 3 bytes, first at 17, 90, 4096; ...)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

# Every reason a document or file can be skipped for; a fixed vocabulary so
# tests and dashboards can rely on the keys.
SKIP_REASONS = (
    "empty_file",  # a file with no bytes, or only whitespace
    "binary_file",  # a file with NUL bytes in its first MiB: an image, archive, model... not text
    "undecodable_file",  # bytes that are not valid in the file's encoding
    "empty",  # a record whose text is "" or only whitespace
    "non_string",  # a record whose text field is missing, None, a number, a list...
    "short",  # a document with fewer tokens than the configured minimum
)

_MAX_EXAMPLES = 5
# What to do about each cause; shown when nothing usable is left.
_FIXES = {
    "empty_file": "fill or remove the empty files",
    "binary_file": "leave binary files out of the data paths/globs",
    "undecodable_file": "re-encode the files as UTF-8 (e.g. iconv -t UTF-8) or leave them out",
    "empty": "check that [data].text_field names the field holding the text",
    "non_string": "check that [data].text_field names a string field of every record",
    "short": "lower [data].min_doc_tokens to keep short documents",
}


@dataclass
class BadDataReport:
    """Per-reason skip counts plus a few example locations.

    Attributes:
        kept: documents that passed every check.
        counts: reason -> number of skipped items (files or records).
        examples: reason -> up to 5 locations ("path", "path:record 17", ...).
        files_read: local files looked at (usable or not); 0 for hub datasets.
        tokens_kept: tokens of the kept documents in the token stream (EOS included);
            0 until the stream is built.
        replaced: file -> ``{"bytes": n, "offsets": [...]}``: bytes that are not UTF-8 read as
            U+FFFD in that file, and the byte offsets (from 0) of the first 5 invalid sequences.
    """

    kept: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    files_read: int = 0
    tokens_kept: int = 0
    replaced: dict[str, dict] = field(default_factory=dict)

    def skip(self, reason: str, where: str) -> None:
        """Record one skipped item. ``reason`` must be one of SKIP_REASONS."""
        if reason not in SKIP_REASONS:
            raise ValueError(f"unknown skip reason {reason!r}; expected one of {SKIP_REASONS}")
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < _MAX_EXAMPLES:
            shown.append(where)

    def add_replaced(self, where: str, n_bytes: int, offsets: list[int]) -> None:
        """Record ``n_bytes`` undecodable bytes of file ``where`` replaced by U+FFFD, the first at ``offsets``."""
        entry = self.replaced.setdefault(where, {"bytes": 0, "offsets": []})
        entry["bytes"] += n_bytes
        entry["offsets"].extend(offsets[: _MAX_EXAMPLES - len(entry["offsets"])])

    @property
    def skipped(self) -> int:
        """Total number of skipped items over all reasons."""
        return sum(self.counts.values())

    def merge(self, other: "BadDataReport") -> None:
        """Add another report's counts (examples up to the cap) into this one."""
        self.kept += other.kept
        self.files_read += other.files_read
        self.tokens_kept += other.tokens_kept
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
            shown = self.examples.setdefault(reason, [])
            shown.extend(other.examples.get(reason, [])[: _MAX_EXAMPLES - len(shown)])
        for where, entry in other.replaced.items():
            self.add_replaced(where, entry["bytes"], entry["offsets"])

    def summary(self, what: str) -> str:
        """One human-readable line: files read, documents and tokens kept, skips per cause.

        e.g. ``train: read 5 files; kept 3 documents (812 tokens); skipped 2: empty_file=1 (e.g. c.txt); ...``;
        when nothing was kept, each cause is followed by its fix.
        """
        head = f"{what}: " + (f"read {self.files_read} files; " if self.files_read else "")
        head += f"kept {self.kept} documents" + (f" ({self.tokens_kept:,} tokens)" if self.tokens_kept else "")
        tail = self._replaced_summary()
        if not self.counts:
            return f"{head}; nothing skipped{tail}"
        parts = []
        for reason in SKIP_REASONS:
            if reason in self.counts:
                part = f"{reason}={self.counts[reason]} (e.g. {', '.join(self.examples.get(reason, []))})"
                parts.append(part + (f": {_FIXES[reason]}" if self.kept == 0 else ""))
        return f"{head}; skipped {self.skipped}: " + "; ".join(parts) + tail

    def _replaced_summary(self) -> str:
        """``"; replaced N bytes ... in K files (f: n bytes at offsets ...; ...)"``, or "" when none were."""
        if not self.replaced:
            return ""
        total = sum(e["bytes"] for e in self.replaced.values())
        shown = [f"{where}: {e['bytes']} byte{'s' * (e['bytes'] != 1)}, first at {', '.join(map(str, e['offsets']))}"
                 for where, e in list(self.replaced.items())[:_MAX_EXAMPLES]]
        more = "; ..." if len(self.replaced) > _MAX_EXAMPLES else ""
        return (f"; replaced {total} byte{'s' * (total != 1)} that are not UTF-8 by U+FFFD in {len(self.replaced)} "
                f"file{'s' * (len(self.replaced) != 1)} ({'; '.join(shown)}{more}; byte offsets): a file in another "
                "encoding has many; re-encode it as UTF-8 (e.g. iconv -t UTF-8) or set "
                "[data].decode_errors = 'skip_file'")

    def log(self, logger: logging.Logger, what: str) -> None:
        """Log the summary: a warning when anything was skipped or replaced, info otherwise."""
        level = logging.WARNING if self.counts or self.replaced else logging.INFO
        logger.log(level, self.summary(what))

    def to_dict(self) -> dict:
        """JSON-serialisable form (stored next to caches and corpora)."""
        return {"kept": self.kept, "counts": dict(self.counts),
                "examples": {k: list(v) for k, v in self.examples.items()},
                "files_read": self.files_read, "tokens_kept": self.tokens_kept,
                "replaced": {k: {"bytes": v["bytes"], "offsets": list(v["offsets"])} for k, v in self.replaced.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "BadDataReport":
        # files_read / tokens_kept / replaced are absent from reports written before they existed.
        return cls(kept=int(d["kept"]), counts=dict(d["counts"]),
                   examples={k: list(v) for k, v in d["examples"].items()},
                   files_read=int(d.get("files_read", 0)), tokens_kept=int(d.get("tokens_kept", 0)),
                   replaced={k: {"bytes": int(v["bytes"]), "offsets": [int(o) for o in v["offsets"]]}
                             for k, v in d.get("replaced", {}).items()})
