"""Is a failed write a full disk? Then say so, naming the path, instead of the writer's riddle.

A full disk (or an exhausted quota) reaches Python in two ways:

- an ``OSError`` with errno ``ENOSPC`` / ``EDQUOT`` from Python's own writes
  (the resolved config, the tokenizer copy, the manifest's fsync): certain;
- a ``RuntimeError`` from the C++ zip writer behind ``torch.save`` (what
  DeepSpeed saves shards with), which drops the errno: ``unexpected pos
  1708096 vs 1707984``, ``basic_ios::clear: iostream error``, ``file write
  failed``. For these a small probe write in the same directory tells whether
  the disk is full (the probe is removed).

``is_disk_full(exc, directory)`` decides; ``DiskFullError`` is what a
checkpoint save raises then (an ``OSError`` with errno ``ENOSPC``, the message
starting with "disk full").
"""

from __future__ import annotations

import errno
import os
import tempfile
import traceback
from pathlib import Path


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# Words of torch's stream writer (caffe2 inline_container) when a write to its file failed.
_WRITER_FAILURES = ("unexpected pos", "iostream error", "file write failed", "PytorchStreamWriter failed")
_PROBE_BYTES = 1 << 20


class DiskFullError(OSError):
    """A write failed because the filesystem (or the user's quota) is full; ``str()`` names the path."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and len(seen) < 8 and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _probe_is_full(directory: Path) -> bool:
    """Write and fsync ``_PROBE_BYTES`` in ``directory``: True if the filesystem refuses for lack of space."""
    try:
        fd, name = tempfile.mkstemp(prefix=".disk_probe_", dir=directory)
    except OSError as exc:
        return exc.errno in _FULL_ERRNOS
    try:
        os.write(fd, b"\0" * _PROBE_BYTES)
        os.fsync(fd)
        return False
    except OSError as exc:
        return exc.errno in _FULL_ERRNOS
    finally:
        os.close(fd)
        os.unlink(name)


def is_disk_full(exc: BaseException, directory: str | Path) -> bool:
    """Did ``exc`` (raised while writing into ``directory``) come from a full disk? (module doc)"""
    chain = _chain(exc)
    if any(isinstance(e, OSError) and e.errno in _FULL_ERRNOS for e in chain):
        return True
    if any(isinstance(e, RuntimeError) and any(w in str(e) for w in _WRITER_FAILURES) for e in chain):
        directory = Path(directory)
        return directory.is_dir() and _probe_is_full(directory)
    return False


def free_bytes(directory: str | Path) -> int | None:
    """Bytes this process may still write on ``directory``'s filesystem (None if unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def release_frames(exc: BaseException) -> None:
    """Clear the local variables of the finished frames in ``exc``'s tracebacks (its causes' too):
    a writer object left there (torch's zip writer) closes its file. The traceback's lines stay."""
    for e in _chain(exc):
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
