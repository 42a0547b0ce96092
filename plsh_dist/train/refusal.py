"""Refusals: the user's input cannot be run as given. One message, exit code 2, nothing written.

A run can be refused before any training for five kinds of input: the
``config`` (values, or the parallel layout once the world size is known), the
``out_dir`` (another live run holds it, or it cannot be written: run_lock.py),
the ``data`` (an empty or too small corpus), the ``resume`` choice (a
checkpoint trained with another model or at another sequence length, a
schedule or step count it cannot continue, an unfinished tag) and the
``checkpoint`` itself (damaged, truncated, unsafe). These are the user's to fix, not crashes: the
launcher prints ``<kind> error: <message>`` once, with no traceback, writes no
failure file and exits ``EXIT_REFUSED``. Anything else (a bug, out of memory,
a lost peer) goes through ``failure.py``: exit 1 with its traceback, or 3.

The package raises ``ValueError`` (naming the field and the fix) for bad
input; ``refusing`` turns the ``ValueError`` of one set-up phase into a
``RunRefused`` of that kind, so an error raised outside those phases keeps
its traceback.

Printed once: checks that every rank runs alike (the config, the resume
choice, the data as rank 0 prepares it and shares the verdict) refuse on every
rank, and only rank 0 prints (``every_rank=True``). A refusal only one rank
can see (a checkpoint file only it reads) is printed by that rank, its rank
named.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

EXIT_REFUSED = 2
KINDS = ("config", "out_dir", "data", "resume", "checkpoint")


class RunRefused(Exception):
    """The run's input was refused; ``str(self)`` says what and how to fix it.

    ``kind``: one of ``KINDS``; ``every_rank``: every rank raises the same refusal
    (then only rank 0 prints it).
    """

    def __init__(self, kind: str, message: str, *, every_rank: bool = True):
        if kind not in KINDS:
            raise ValueError(f"refusal kind {kind!r} is not one of {KINDS}")
        super().__init__(message)
        self.kind, self.every_rank = kind, every_rank


@contextmanager
def refusing(kind: str, *, every_rank: bool = True, errors: tuple[type[BaseException], ...] = (ValueError,)
             ) -> Iterator[None]:
    """Re-raise ``errors`` raised inside the block as ``RunRefused(kind)``, chained to the original."""
    try:
        yield
    except RunRefused:
        raise
    except errors as exc:
        raise RunRefused(kind, str(exc), every_rank=every_rank) from exc


def refusal_message(exc: RunRefused, rank: int) -> str | None:
    """The line(s) ``rank`` prints for ``exc``; None when another rank prints it."""
    if exc.every_rank:
        return f"{exc.kind} error: {exc}" if rank == 0 else None
    return f"rank {rank}: {exc.kind} error: {exc}"
