"""Can an output directory be written? Checked before any work, so a bad path costs nothing.

``check_writable_dir(path, setting)`` raises ValueError naming the setting and
the fix when ``path`` is an existing file, sits under one, or cannot be
written: the directory itself when it exists, else the nearest existing
directory above it (where it would be created). ``why_unwritable(path)`` is
the same verdict as words (None: writable), for callers whose message says
more (why the directory is written at all). Neither writes anything:
``os.access`` answers for permissions, for a read-only filesystem (EROFS) and
for an immutable directory (EPERM), root included.
"""

from __future__ import annotations

import os
from pathlib import Path


def why_unwritable(path: str | Path) -> str | None:
    """Why directory ``path`` cannot be written or created, as the end of a sentence
    starting with the path (``"is not writable (...)"``); None when it can."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return "is an existing file, not a directory"
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot be created: {str(existing)!r} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == path else f"would be created in {str(existing)!r}, not writable"
        return f"{where} (a read-only filesystem or no permission)"
    return None


def check_writable_dir(path: str | Path, setting: str) -> None:
    """ValueError unless ``path`` is a directory this process can write, or can create.

    ``setting``: how the user gave the path, e.g. ``"[run].out_dir"`` or ``"--out"``.
    """
    why = why_unwritable(path)
    if why is None:
        return
    fix = f"choose another {setting}"
    if why.startswith("is an existing file"):
        fix += " (or move the file away)"
    elif why.endswith("(a read-only filesystem or no permission)"):
        fix += " on a writable disk"
    raise ValueError(f"{setting} = {str(path)!r} {why}; {fix}")
