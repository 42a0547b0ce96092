"""The memory a CPU run plans against: one machine's, shared by every rank on that machine.

On GPUs each rank has its own device memory. On CPU the ranks of a node are
processes of one machine and share its RAM, so a rank's budget is the
machine's memory divided by the ranks on it (``per_rank_budget``).

``machine_memory()`` reads what a new run can have now: ``MemAvailable`` of
``/proc/meminfo`` (free memory plus the caches the kernel gives back), with
``MemTotal`` beside it for the report, and what DeepSpeed buffers left in
``/dev/shm`` hold of it (cpu_shm.py). Where there is no ``/proc/meminfo``
the whole physical memory (``os.sysconf`` ``SC_PHYS_PAGES`` x
``SC_PAGE_SIZE``) stands in for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from plsh_dist.distributed.cpu_shm import SHM_DIR, left_buffers_note

_MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class MachineMemory:
    """Bytes of one machine's memory."""

    available: int
    """What the plan counts on (shared by the machine's ranks)."""
    total: int
    source: str
    """Where ``available`` was read, e.g. ``"MemAvailable in /proc/meminfo"``."""


def _meminfo_kib(text: str) -> dict[str, int]:
    """``"MemTotal:  24684084 kB"`` lines -> ``{"MemTotal": 24684084}`` (KiB)."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0])
    return fields


def machine_memory(meminfo: Path = _MEMINFO, shm_dir: Path = SHM_DIR) -> MachineMemory:
    """This machine's memory (module doc)."""
    if meminfo.is_file():
        kib = _meminfo_kib(meminfo.read_text())
        if "MemAvailable" in kib and "MemTotal" in kib:
            left = left_buffers_note(shm_dir)
            return MachineMemory(available=kib["MemAvailable"] * 1024, total=kib["MemTotal"] * 1024,
                                 source=f"MemAvailable in {meminfo}" + (f"; {left}" if left else ""))
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return MachineMemory(available=physical, total=physical, source="physical memory (os.sysconf SC_PHYS_PAGES)")


def per_rank_budget(machine_bytes: int, ranks_on_machine: int) -> int:
    """One rank's share of a machine's memory."""
    if ranks_on_machine < 1:
        raise ValueError(f"ranks on a machine must be >= 1, got {ranks_on_machine}")
    return machine_bytes // ranks_on_machine
