"""What a rank does when training fails: say once who failed and why, then exit non-zero.

A refusal of the user's input (``RunRefused``: config, data, resume,
checkpoint; refusal.py) is no failure: one ``<kind> error: ...`` message, no
traceback, no failure file, exit code ``EXIT_REFUSED`` (2). Two kinds of
error reach a rank's top level, and they need different messages:

- **its own error** (a bug, out of memory, bad data, an injected ``PLSH_FAULT``):
  one block ``rank R failed: <ExcType>: <message>`` plus the traceback on
  stderr, the same text in ``<out_dir>/failures/rank_R.txt``, and the
  exception recorded for torchrun (``TORCHELASTIC_ERROR_FILE``) so torchrun's
  summary names this rank as the root cause. Exit code ``EXIT_OWN_ERROR``.
- **a peer's failure seen through a collective** (a lost connection, or a
  timeout after ``[parallel].timeout_s`` because a peer hung): the traceback
  would only show where this rank was waiting, which points at the wrong
  place. One line instead, naming the failure files other ranks wrote, if
  any. Exit code ``EXIT_PEER_FAILED``.
- **an unreachable rendezvous** (``RendezvousUnreachable``: unknown host,
  network down, refused port; plsh_dist/distributed/rendezvous.py): one line
  ``rank R failed: rendezvous ADDR:PORT unreachable ...``, no traceback (it
  would only show the check), no failure file (no run began). ``EXIT_OWN_ERROR``.

Why ``os._exit`` after reporting: once a peer is gone, normal interpreter
shutdown may run process-group and DeepSpeed destructors that talk to that
peer and block; a failing rank must end promptly so the launcher stops the
others. Output is flushed first (metrics.jsonl is flushed per record).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, NoReturn

from plsh_dist.checkpoint.manifest import write_text_atomic
from plsh_dist.distributed.rendezvous import RendezvousUnreachable
from plsh_dist.train.refusal import EXIT_REFUSED, RunRefused, refusal_message

EXIT_OWN_ERROR = 1
EXIT_PEER_FAILED = 3
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT
# Seconds a rank that only lost a peer waits before exiting (> 1 s: torchrun's failure
# timestamps are whole seconds).
PEER_EXIT_DELAY_S = 2.0

# Failure files older than this process belong to an earlier run in the same out_dir.
_PROCESS_START = time.time()

# Substrings of gloo / NCCL / c10d errors raised on a rank whose peer died, closed
# its sockets, or never joined a collective within the timeout. Own errors
# (shape mismatches, OOM, bad data) never contain these.
_PEER_PATTERNS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out",
    "timeout",
    "econnreset",
    "epipe",
    "communicator was aborted",
    "nccl error",
    "remote process exited",
    "read error",
    "socket",
)


class PeerGone(Exception):
    """A rank this one waits for outside any collective is gone or hung (data_wait.py): a peer failure,
    whose message names that rank and what it was doing."""


def is_peer_failure(exc: BaseException) -> bool:
    """True if ``exc`` (or an exception it was raised from) is a collective failing
    because another rank died, hung or closed its connection."""
    import torch.distributed as dist

    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, PeerGone):
            return True
        comm_error = isinstance(exc, getattr(dist, "DistError", ())) or type(exc) is RuntimeError
        if comm_error and any(p in str(exc).lower() for p in _PEER_PATTERNS):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _failure_dir(out_dir: str | Path | None) -> Path | None:
    return Path(out_dir) / "failures" if out_dir else None


def _recent_failure_files(failure_dir: Path | None) -> list[str]:
    """Failure files written by this run's ranks (newer than this process)."""
    if failure_dir is None or not failure_dir.is_dir():
        return []
    return sorted(str(p) for p in failure_dir.glob("rank_*.txt") if p.stat().st_mtime >= _PROCESS_START - 1.0)


def report_failure(exc: BaseException, rank: int, out_dir: str | Path | None) -> int:
    """Print (and for own errors, write) the report for ``exc`` on ``rank``; return the exit code.

    ``out_dir``: the run's output directory ([run].out_dir); None when the
    config never loaded (nothing is written then).
    """
    failure_dir = _failure_dir(out_dir)
    if is_peer_failure(exc):
        others = _recent_failure_files(failure_dir)
        where = f"see {', '.join(others)}" if others else (
            "no rank reported an error of its own: a peer was killed (out of memory? lost node?) or hung; "
            "the launcher's log names it")
        first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        print(f"rank {rank}: stopping, a peer rank failed or timed out: {type(exc).__name__}: {first_line}; "
              f"the failing rank's error is above / {where}", file=sys.stderr, flush=True)
        return EXIT_PEER_FAILED

    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code is run_reporting_failures.__code__:
        tb = tb.tb_next  # the user's traceback starts at the training code, not at this wrapper
    text = (f"rank {rank} failed: {type(exc).__name__}: {exc}\n"
            + "".join(traceback.format_exception(type(exc), exc, tb)))
    banner = "=" * 78
    print(f"{banner}\n{text.rstrip()}\n{banner}", file=sys.stderr, flush=True)
    if failure_dir is not None:
        try:
            failure_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(failure_dir / f"rank_{rank}.txt", text)  # the whole report or no file, never empty
        except OSError as write_error:  # a full or read-only disk must not hide the real error
            print(f"rank {rank}: could not write {failure_dir}/rank_{rank}.txt: {write_error}", file=sys.stderr)
    _record_for_torchrun(exc)
    return EXIT_OWN_ERROR


def _record_for_torchrun(exc: BaseException) -> None:
    """Write torchrun's error file (only when torchrun set TORCHELASTIC_ERROR_FILE), so its
    "Root Cause" summary shows this rank's exception instead of just an exit code."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
    except Exception as record_error:  # reporting must never replace the real error
        print(f"could not record the error for torchrun: {record_error}", file=sys.stderr)


def run_reporting_failures(fn: Callable[[], int], *, rank: int, out_dir: str | Path | None) -> int:
    """Run ``fn`` and return its exit code; on an exception report it and end the
    process at once with a non-zero code (see module docstring for why ``os._exit``)."""
    try:
        return fn()
    except KeyboardInterrupt:
        # Ctrl-C reaches every rank: not a failure to write up, just stop.
        print(f"rank {rank}: interrupted", file=sys.stderr)
        _exit_now(EXIT_INTERRUPTED)
    except RunRefused as refused:  # the user's input, not a crash: one message, nothing written
        message = refusal_message(refused, rank)
        if message is not None:
            print(message, file=sys.stderr, flush=True)
        _exit_now(EXIT_REFUSED)
    except RendezvousUnreachable as unreachable:  # before any work: the address and the cause are the whole story
        print(f"rank {rank} failed: {unreachable}", file=sys.stderr, flush=True)
        _record_for_torchrun(unreachable)
        _exit_now(EXIT_OWN_ERROR)
    except Exception as exc:  # noqa: BLE001 - every failure must be reported
        code = report_failure(exc, rank, out_dir)
        if code == EXIT_PEER_FAILED:
            # Let the rank with the real error leave first: torchrun names the failure with the
            # earliest exit time (whole seconds, ties to the lowest rank) as the root cause.
            time.sleep(PEER_EXIT_DELAY_S)
        _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
