"""Measured peak memory of CPU code: live torch bytes, and the process's RSS.

``peak_cpu_bytes(fn)`` runs ``fn()`` under torch's profiler with memory
profiling on and returns the peak of the bytes allocated through torch's CPU
allocator *since the call started* (allocations minus their frees, in time
order): the CPU counterpart of ``torch.cuda.max_memory_allocated`` over the
call, without the interpreter, the libraries or the allocator's caching.
Tensors that existed before the call count only by what they add (a free of
one of them is not reported by the profiler, so it never lowers the count).

Kineto (the profiler's backend) prints a ``USDT: ... profiler_start`` and
``profiler_stop`` line to stderr around every profile at its default log
level; ``peak_cpu_bytes`` sets ``KINETO_LOG_LEVEL=6`` (above its highest
level, USDT = 5; read when the profiler first starts in the process) unless
the environment sets it already.

``rss_bytes()`` / ``peak_rss_bytes()``: the process's current and peak
resident set (what the operating system sees, allocator caching included).
"""

from __future__ import annotations

import gc
import os
import resource
import sys
from collections.abc import Callable
from typing import Any


def peak_cpu_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``(fn(), peak bytes)``: the highest count of live CPU tensor bytes that ``fn``
    allocated (module doc). Profiles every op of ``fn``: for measurements, not hot loops."""
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # no USDT profiler_start / profiler_stop lines (module doc)
    # Garbage from before the window (an earlier run's engine, held in reference cycles) would
    # otherwise be collected at some allocation inside it, and its frees counted against the peak.
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type().name == "CPU"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return result, peak


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
    except OSError:
        return 0
    return pages * resource.getpagesize()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024
