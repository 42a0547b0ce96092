"""A fresh start never writes over a previous run's records: the previous run is moved aside, whole.

A run continues the records in its out_dir (metrics.jsonl, checkpoints/,
final/, config.resolved.*) only when it resumes from that out_dir's own
checkpoints. Any other start there (``--resume never``; ``--resume auto``
with no checkpoint, e.g. after a run killed before its first one; a resume
from another run's checkpoint) is a new run. If the out_dir already holds
anything (the lock file aside), the whole directory is renamed, unchanged,
to a sibling ``<out_dir>.previous-<YYYYmmdd-HHMMSS>`` (the time it was moved;
``-2``, ``-3``... if taken) and the new run starts in an empty out_dir: one
rename, so a kill leaves either the old directory or the moved one, never a
mix. Nothing is deleted; remove the moved run by hand when it is no longer
needed.

This happens once the run is accepted (every check passed), by rank 0,
holding the run directory's lock (run_lock.py), which moves with the
directory and is linked again under the old name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from plsh_dist.train.run_lock import LOCK_NAME, RunDirLock


def holds_a_run(out_dir: str | Path) -> bool:
    """True when ``out_dir`` exists and holds anything besides its lock files."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return False
    return any(not p.name.startswith((LOCK_NAME, f".{LOCK_NAME}.")) for p in out_dir.iterdir())


def previous_run_path(out_dir: str | Path, now: float | None = None) -> Path:
    """A free sibling name for the run in ``out_dir``: ``<out_dir>.previous-<YYYYmmdd-HHMMSS>[-N]``."""
    out_dir = Path(out_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    base = out_dir.with_name(f"{out_dir.name}.previous-{stamp}")
    target, n = base, 1
    while target.exists():
        n += 1
        target = base.with_name(f"{base.name}-{n}")
    return target


def set_aside_previous_run(out_dir: str | Path, lock: RunDirLock | None = None) -> Path | None:
    """Rename ``out_dir`` to ``previous_run_path(out_dir)`` if it holds a run; its new path, or None.

    ``lock``: this process's lock of ``out_dir``, kept across the rename (``RunDirLock.set_aside_run``);
    None for a caller that holds none (it checked ``run_lock.live_holder`` first)."""
    out_dir = Path(out_dir)
    if not holds_a_run(out_dir):
        return None
    target = previous_run_path(out_dir)
    if lock is not None:
        lock.set_aside_run(target)
    else:
        os.rename(out_dir, target)
    return target
