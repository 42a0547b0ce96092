"""Peak resident memory of every training rank on the namespace hosts, read from outside them.

The machine's /proc shows every process of every host (a PID namespace is
nested in the machine's). A rank is a process whose command line runs
``launchers/pretrain.py`` with DeepSpeed's ``--local_rank=N`` (the runner's
own processes, pdsh and ssh carry the script's name but not that flag); its
host is the one whose init shares its UTS namespace; its peak is the
kernel's high-water mark of its resident set (``VmHWM`` in
``/proc/PID/status``), kept as last read: the process's own maximum, however
short the spike, as long as it is read once before the process exits, so
the sampler reads every ``interval_s`` seconds.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["RankMemory"]


def _uts(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def _rank_of(pid: str) -> int | None:
    """The local rank of a training process ``pid`` (module doc), None for any other process."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not any(a.endswith(b"pretrain.py") for a in argv):
        return None
    for arg in argv:
        if arg.startswith(b"--local_rank="):
            return int(arg.split(b"=", 1)[1])
    return None


def _peak_bytes(pid: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class RankMemory:
    """Samples the ranks' peaks while in a ``with`` block; ``peaks()``: ``{"node-0/rank0": bytes, ...}``.

    ``hosts``: ``(name, init pid)`` of each host (``tools.cluster.hosts.Host``'s name and pid).
    """

    def __init__(self, hosts: list[tuple[str, int]], interval_s: float = 0.5):
        self._uts = {_uts(pid): name for name, pid in hosts}
        self.interval_s = interval_s
        self._peak: dict[tuple[str, int, int], int] = {}  # (host, pid, local rank) -> bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-memory", daemon=True)

    def __enter__(self) -> "RankMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """Read every rank's high-water mark once."""
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            host = self._uts.get(_uts(pid))
            if host is None:
                continue
            rank = _rank_of(pid)
            peak = _peak_bytes(pid) if rank is not None else None
            if peak is not None:
                key = (host, int(pid), rank)
                self._peak[key] = max(peak, self._peak.get(key, 0))

    def peaks(self) -> dict[str, int]:
        """The highest peak per host and local rank (over every process that rank had)."""
        out: dict[str, int] = {}
        for (host, _pid, rank), peak in sorted(self._peak.items()):
            name = f"{host}/local_rank{rank}"
            out[name] = max(peak, out.get(name, 0))
        return out
