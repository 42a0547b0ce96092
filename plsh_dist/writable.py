"""Can an output directory be written? Checked before any work, so a bad path costs nothing.

``check_writable_dir(path, setting)`` raises ValueError naming the setting and
the fix when ``path`` is an existing file, sits under one, or cannot be
written: the directory itself when it exists, else the nearest existing
directory above it (where it would be created). It writes nothing:
``os.access`` answers for permissions, for a read-only filesystem (EROFS) and
for an immutable directory (EPERM), root included.
"""

from __future__ import annotations

import os
from pathlib import Path


def check_writable_dir(path: str | Path, setting: str) -> None:
    """ValueError unless ``path`` is a directory this process can write, or can create.

    ``setting``: how the user gave the path, e.g. ``"[run].out_dir"`` or ``"--out"``.
    """
    path = Path(path)
    fix = f"choose another {setting}"
    if path.exists() and not path.is_dir():
        raise ValueError(f"{setting} = {str(path)!r} is an existing file, not a directory; {fix} "
                         f"(or move the file away)")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{setting} = {str(path)!r} cannot be created: {str(existing)!r} is a file, not a "
                         f"directory; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == path else f"would be created in {str(existing)!r}, not writable"
        raise ValueError(f"{setting} = {str(path)!r} {where} (a read-only filesystem or no permission); {fix} "
                         f"on a writable disk")
