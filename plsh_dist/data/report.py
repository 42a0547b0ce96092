"""Counting bad data instead of silently using (or silently dropping) it.

Every stage that skips something (an empty file, undecodable bytes, a record
whose text field is not a string, a document shorter than the minimum) calls
``BadDataReport.skip(reason, where)``; the report keeps a count per reason and
the first few locations so the log line says *what* was skipped and *where*.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

__all__ = ["BadDataReport", "SKIP_REASONS"]

# Every reason a document or file can be skipped for; a fixed vocabulary so
# tests and dashboards can rely on the keys.
SKIP_REASONS = (
    "empty_file",  # a file with no bytes, or only whitespace
    "undecodable_file",  # bytes that are not valid in the file's encoding
    "empty",  # a record whose text is "" or only whitespace
    "non_string",  # a record whose text field is missing, None, a number, a list...
    "short",  # a document with fewer tokens than the configured minimum
)

_MAX_EXAMPLES = 5


@dataclass
class BadDataReport:
    """Per-reason skip counts plus a few example locations.

    Attributes:
        kept: documents that passed every check.
        counts: reason -> number of skipped items (files or records).
        examples: reason -> up to 5 locations ("path", "path:record 17", ...).
    """

    kept: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, reason: str, where: str) -> None:
        """Record one skipped item. ``reason`` must be one of SKIP_REASONS."""
        if reason not in SKIP_REASONS:
            raise ValueError(f"unknown skip reason {reason!r}; expected one of {SKIP_REASONS}")
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < _MAX_EXAMPLES:
            shown.append(where)

    @property
    def skipped(self) -> int:
        """Total number of skipped items over all reasons."""
        return sum(self.counts.values())

    def merge(self, other: "BadDataReport") -> None:
        """Add another report's counts (examples up to the cap) into this one."""
        self.kept += other.kept
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
            shown = self.examples.setdefault(reason, [])
            shown.extend(other.examples.get(reason, [])[: _MAX_EXAMPLES - len(shown)])

    def summary(self, what: str) -> str:
        """One human-readable line, e.g. ``train: kept 120 documents; skipped 3 (empty=2 ...)``."""
        if not self.counts:
            return f"{what}: kept {self.kept} documents; nothing skipped"
        parts = [
            f"{reason}={self.counts[reason]} (e.g. {', '.join(self.examples.get(reason, []))})"
            for reason in SKIP_REASONS
            if reason in self.counts
        ]
        return f"{what}: kept {self.kept} documents; skipped {self.skipped}: " + "; ".join(parts)

    def log(self, logger: logging.Logger, what: str) -> None:
        """Log the summary: a warning when anything was skipped, info otherwise."""
        level = logging.WARNING if self.counts else logging.INFO
        logger.log(level, self.summary(what))

    def to_dict(self) -> dict:
        """JSON-serialisable form (stored next to caches and corpora)."""
        return {"kept": self.kept, "counts": dict(self.counts), "examples": {k: list(v) for k, v in self.examples.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "BadDataReport":
        return cls(kept=int(d["kept"]), counts=dict(d["counts"]), examples={k: list(v) for k, v in d["examples"].items()})
