"""One run at a time in a run directory: a lock file that works across nodes and dies with its run.

``<out_dir>/run.lock`` is held by global rank 0 of the run writing there, for the whole of ``train``;
a second job on the same out_dir is refused before it reads or writes anything there (exit 2,
``out_dir error:``, naming the holder). Without it, two jobs interleave their checkpoints,
``latest``, metrics.jsonl and final/, and each sets the other's newer checkpoints aside.
The lock is hard-linked from a private file (atomic, NFS included), kept alive by a heartbeat
thread, taken over when stale, released on every way out of ``train``, and its verdict is
broadcast to every rank (``claim_out_dir``). How and why: docs/training.md, "One run per
out_dir: the lock".
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from plsh_dist.train.refusal import RunRefused

LOCK_NAME = "run.lock"
HEARTBEAT_S = 15.0
"""Seconds between two touches of the lock file by its holder."""
STALE_AFTER_S = 180.0
"""A lock from another machine (or boot, or pid namespace) is stale once its heartbeat is this old."""
_BREAK_STALE_S = 30.0
"""A ``run.lock.break`` this old was left by a job killed while taking over a stale lock."""


class OutDirBusy(Exception):
    """Another live run holds the out_dir's lock (or the lock cannot be made); ``str`` says which and what to do."""


def _read_first_line(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """The start time of ``pid`` since boot (``/proc/<pid>/stat`` field 22), "" where unknown."""
    stat = _read_first_line(f"/proc/{pid}/stat")
    fields = stat.rsplit(")", 1)[-1].split()  # the command name, in parentheses, may hold spaces
    return fields[19] if len(fields) > 19 else ""


def _process_state(pid: int) -> str:
    stat = _read_first_line(f"/proc/{pid}/stat")
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] if fields else ""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a lock: the record written into ``run.lock``."""

    host: str
    pid: int
    started: float
    """Seconds since the epoch when the lock was taken."""
    command: str
    token: str
    """Random, unique per lock taken: tells this lock from a later one of the same process."""
    boot_id: str = ""
    pid_namespace: str = ""
    process_start: str = ""
    """Start time of ``pid`` since boot, to tell it from a later process given the same pid."""

    @classmethod
    def this_process(cls) -> Holder:
        return cls(host=socket.gethostname(), pid=os.getpid(), started=time.time(),
                   command=shlex.join([os.path.basename(sys.executable), *sys.argv]), token=secrets.token_hex(8),
                   boot_id=_read_first_line("/proc/sys/kernel/random/boot_id"), pid_namespace=_pid_namespace(),
                   process_start=_process_start(os.getpid()))

    def same_pid_space(self, other: Holder) -> bool:
        """True when a pid of ``other`` means the same process here (same machine, boot and pid namespace)."""
        return (self.host, self.boot_id, self.pid_namespace) == (other.host, other.boot_id, other.pid_namespace)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on host {self.host}, started {when}, command: {self.command}"


def _stale_reason(holder: Holder, heartbeat_age_s: float, me: Holder) -> str | None:
    """Why ``holder``'s lock is stale, or None while its run may be alive (module doc)."""
    if me.same_pid_space(holder):
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return "its process is gone"
        except PermissionError:
            pass  # alive, run by another user
        if _process_state(holder.pid) == "Z":
            return "its process is gone (a zombie)"
        start = _process_start(holder.pid)
        if holder.process_start and start and start != holder.process_start:
            return "its process is gone (the pid now belongs to another process)"
        return None
    if heartbeat_age_s > STALE_AFTER_S:
        return f"its heartbeat is {heartbeat_age_s:.0f} s old (a lock from another machine is stale after " \
               f"{STALE_AFTER_S:.0f} s)"
    return None


def _read_lock(path: Path) -> tuple[Holder | None, float]:
    """``(holder, heartbeat age in s)`` of the lock at ``path``; holder None when unreadable.
    FileNotFoundError when there is none."""
    age = time.time() - path.stat().st_mtime
    try:
        return Holder(**json.loads(path.read_text())), age
    except (ValueError, TypeError):
        return None, age


def _link_new(path: Path, holder: Holder) -> None:
    """Create ``path`` holding ``holder`` atomically; FileExistsError if it exists (module doc)."""
    private = path.with_name(f".{path.name}.{holder.token}.{os.getpid()}")
    try:
        with open(private, "x") as fh:
            fh.write(json.dumps(asdict(holder)) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.link(private, path)
    finally:
        private.unlink(missing_ok=True)


def _break_stale(path: Path, stale: Holder | None) -> bool:
    """Remove the stale lock ``stale`` (None: the unreadable one) if it is still there; False when
    another job is breaking it right now (then look again)."""
    breaker = path.with_name(path.name + ".break")
    try:
        fd = os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:
            if time.time() - breaker.stat().st_mtime > _BREAK_STALE_S:
                breaker.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        return False
    os.close(fd)
    try:
        current, _ = _read_lock(path)
        if current == stale:
            path.unlink()
    except FileNotFoundError:
        pass
    finally:
        breaker.unlink(missing_ok=True)
    return True


def _make_dirs(directory: Path) -> list[Path]:
    """``mkdir -p directory``; the directories it created, outermost first."""
    missing = []
    d = directory
    while not d.exists():
        missing.append(d)
        if d.parent == d:
            break
        d = d.parent
    directory.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def _notice(text: str) -> None:
    print(f"plsh_dist: {text}", file=sys.stderr, flush=True)


def take_or_see_holder(path: Path, me: Holder) -> tuple[bool, Holder | None, float]:
    """One try at the lock file ``path``: ``(True, me, 0)`` when this process took it; ``(False,
    holder, heartbeat age)`` when a live process holds it; ``(False, None, 0.0)`` when it was
    released meanwhile or was stale and taken over (a notice on stderr): try again."""
    try:
        _link_new(path, me)
        return True, me, 0.0
    except FileExistsError:
        pass
    try:
        holder, age = _read_lock(path)
    except FileNotFoundError:
        return False, None, 0.0  # released between the two calls
    # The record is linked in whole (_link_new): one that does not parse was damaged.
    reason = _stale_reason(holder, age, me) if holder is not None else "its record is unreadable"
    if reason is None:
        return False, holder, age
    if _break_stale(path, holder):
        who = holder.describe() if holder is not None else "of unknown holder"
        _notice(f"{path}: the lock {who} is stale ({reason}); taking it over")
    else:
        time.sleep(0.1)
    return False, None, 0.0


class HeldLock:
    """A lock file ``path`` this process holds as ``holder``: a heartbeat thread touches it every
    ``heartbeat_s`` until ``release``, which removes it if it is still this one."""

    def __init__(self, path: Path, holder: Holder, heartbeat_s: float):
        self.path, self.holder, self._heartbeat_s = path, holder, heartbeat_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"{path.name}-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            try:
                os.utime(self.path)
            except OSError:
                pass  # its directory being moved aside (RunDirLock.set_aside_run), or gone: nothing to touch now

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still this one. Idempotent."""
        self._stop.set()
        try:
            current, _ = _read_lock(self.path)
            if current == self.holder:
                self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:  # a vanished or read-only directory must not hide the caller's own result
            _notice(f"could not remove the lock {self.path}: {exc}")


class RunDirLock(HeldLock):
    """The lock of one run directory, held by this process (``acquire``), until ``release``."""

    def __init__(self, out_dir: Path, holder: Holder, created: list[Path]):
        self.out_dir, self._created = out_dir, created
        super().__init__(out_dir / LOCK_NAME, holder, HEARTBEAT_S)

    @classmethod
    def acquire(cls, out_dir: str | Path) -> RunDirLock:
        """Take ``out_dir``'s lock (creating ``out_dir`` if needed), taking over a stale one with a
        notice on stderr; ``OutDirBusy`` naming the holder when a live run has it, or naming the
        error when the lock cannot be written."""
        out_dir = Path(out_dir)
        me = Holder.this_process()
        try:
            created = _make_dirs(out_dir)
        except OSError as exc:
            raise OutDirBusy(f"[run].out_dir = {str(out_dir)!r} cannot be created ({exc.strerror or exc}); "
                             "choose a writable directory with --run.out_dir=...") from exc
        path = out_dir / LOCK_NAME
        try:
            for _ in range(50):
                taken, holder, age = take_or_see_holder(path, me)
                if taken:
                    return cls(out_dir, me, created)
                if holder is not None:
                    raise OutDirBusy(_busy_message(out_dir, holder, age))
            raise OutDirBusy(f"could not take the lock {path}: other jobs keep taking it; "
                             "only one run may use a [run].out_dir at a time")
        except OSError as exc:
            _remove_if_empty(created)
            raise OutDirBusy(f"[run].out_dir = {str(out_dir)!r}: cannot write the run's lock file {path} "
                             f"({exc.strerror or exc}); choose a writable directory with --run.out_dir=...") from exc
        except OutDirBusy:
            _remove_if_empty(created)
            raise

    def set_aside_run(self, target: Path) -> None:
        """Rename the whole out_dir (a previous run in it) to ``target`` and hold the lock of a new,
        empty out_dir: the lock file goes with the rename, so it is linked again under the old name
        at once, then removed from ``target``. ``OutDirBusy`` if another job took the name in between."""
        os.rename(self.out_dir, target)
        try:
            self.out_dir.mkdir()
            _link_new(self.path, self.holder)
        except FileExistsError:
            raise OutDirBusy(f"[run].out_dir = {str(self.out_dir)!r} was taken by another job while this run "
                             f"moved the previous one to {target}") from None
        finally:
            (target / LOCK_NAME).unlink(missing_ok=True)
        self._created = []

    def release(self) -> None:
        """Stop the heartbeat; remove the lock if it is still this one; remove an out_dir the
        lock created if nothing else was written there. Idempotent."""
        super().release()
        _remove_if_empty(self._created)
        self._created = []


def _remove_if_empty(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            return


def _busy_message(out_dir: Path, holder: Holder | None, age: float) -> str:
    who = holder.describe() if holder is not None else "unknown (unreadable lock record)"
    return (f"[run].out_dir = {str(out_dir)!r} is in use by another run: {who} (heartbeat {max(age, 0):.0f} s ago; "
            f"lock {out_dir / LOCK_NAME}). Wait for it to end or stop it, or pass another --run.out_dir=... "
            f"A lock whose run was killed is taken over by the next run: at once on the same machine, after "
            f"{STALE_AFTER_S:.0f} s without heartbeat from another one.")


def live_holder(out_dir: str | Path) -> str | None:
    """The refusal message when a live run holds ``out_dir``'s lock, else None (no lock, or a stale one).
    Reads only: for tools that are about to move or replace a run directory."""
    path = Path(out_dir) / LOCK_NAME
    try:
        holder, age = _read_lock(path)
    except FileNotFoundError:
        return None
    if holder is not None and _stale_reason(holder, age, Holder.this_process()) is None:
        return _busy_message(Path(out_dir), holder, age)
    return None


@contextmanager
def claim_out_dir(out_dir: str | Path, rank: int) -> Iterator[RunDirLock | None]:
    """Collective: global rank 0 takes ``out_dir``'s lock for the block and every rank learns the
    verdict; a busy out_dir raises ``RunRefused("out_dir")`` on every rank (rank 0 prints it).
    Yields the lock on rank 0, None elsewhere."""
    import torch.distributed as dist

    lock, verdict = None, [None]
    if rank == 0:
        try:
            lock = RunDirLock.acquire(out_dir)
        except OutDirBusy as exc:
            verdict = [str(exc)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise RunRefused("out_dir", verdict[0])
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()
