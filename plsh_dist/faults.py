"""Fault injection for the reliability tests: kill, raise, hang or pause one rank on purpose.

Off unless ``PLSH_FAULT`` is set (the launchers pass the environment on to every rank). Format:
``ACTION:RANK:STEP[:WHERE]``, ACTION one of ``kill``, ``raise``, ``enospc``, ``hang``, ``sigterm``,
``sigusr1``, ``pause``; RANK the global rank; STEP the optimizer step (1-based); WHERE one of
``after_step`` (default), ``in_checkpoint``, ``in_prune``, ``in_set_aside``, ``in_step``. E.g.
``PLSH_FAULT=kill:1:3`` kills rank 1 right after step 3. What each action and place does:
docs/training.md, "Failing ranks and timeouts", "Injected faults".

``PLSH_SLOW_TOKENIZE_S=SECONDS`` slows the token cache build: every chunk of documents waits that long
before it is tokenised (``slow_tokenize``), so a test can keep a build running past a timeout or kill it
midway.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time


_ACTIONS = ("kill", "raise", "enospc", "hang", "sigterm", "sigusr1", "pause")
# How long ``pause`` holds its rank: long enough for a test to see the step logged and signal the job
# through a scheduler on a loaded machine (scancel: ~1 s), well below the tests' 60 s collective timeout.
PAUSE_S = 20.0
_PLACES = ("after_step", "in_checkpoint", "in_prune", "in_set_aside", "in_step")


def _parse(spec: str) -> tuple[str, int, int, str]:
    parts = spec.split(":")
    if len(parts) not in (3, 4) or parts[0] not in _ACTIONS or (len(parts) == 4 and parts[3] not in _PLACES):
        raise ValueError(
            f"PLSH_FAULT={spec!r} must look like ACTION:RANK:STEP[:WHERE] with ACTION in {list(_ACTIONS)} "
            f"and WHERE in {list(_PLACES)}, e.g. kill:1:3; unset it for a normal run"
        )
    where = parts[3] if len(parts) == 4 else "after_step"
    return parts[0], int(parts[1]), int(parts[2]), where


def maybe_fail(where: str, step: int, rank: int) -> None:
    """Fail here if ``PLSH_FAULT`` asks for (where, step, rank); otherwise nothing."""
    spec = os.environ.get("PLSH_FAULT")
    if not spec:
        return
    action, fault_rank, fault_step, fault_where = _parse(spec)
    if (where, step, rank) != (fault_where, fault_step, fault_rank):
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action in ("sigterm", "sigusr1"):
        os.kill(os.getpid(), signal.SIGTERM if action == "sigterm" else signal.SIGUSR1)
        return
    if action == "pause":
        print(f"PLSH_FAULT={spec}: rank {rank} pauses {PAUSE_S:.0f} s at step {step} ({where})", file=sys.stderr,
              flush=True)
        time.sleep(PAUSE_S)
        return
    if action == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step} ({where}): PLSH_FAULT={spec}")
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected on rank {rank} at step {step}, "
                                    f"{where}: PLSH_FAULT={spec})")
    while True:  # hang: the other ranks must time out, not wait forever
        time.sleep(3600)


def slow_tokenize() -> None:
    """Wait ``PLSH_SLOW_TOKENIZE_S`` seconds if it is set (module doc); otherwise nothing."""
    delay = os.environ.get("PLSH_SLOW_TOKENIZE_S")
    if delay:
        time.sleep(float(delay))
