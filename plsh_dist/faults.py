"""Fault injection for the reliability tests: kill, raise, hang or pause one rank on purpose.

Off unless ``PLSH_FAULT`` is set (the launchers pass the environment on to
every rank). Format: ``ACTION:RANK:STEP[:WHERE]``

- ACTION: ``kill`` (SIGKILL itself, as the OOM killer or a lost node would),
  ``raise`` (a ``RuntimeError`` carrying ``PLSH_FAULT``), ``enospc`` (an
  ``OSError`` with errno ENOSPC, as a write to a full disk raises), ``hang`` (sleep
  forever without joining collectives), ``sigterm`` / ``sigusr1`` (send
  itself that signal, as a scheduler preempting the job would, and carry on:
  the preemption tests, see preemption.py), ``pause`` (sleep ``PAUSE_S``
  seconds, then carry on: a test that signals the run from outside once a
  step is logged knows the run is still training when the signal lands,
  however fast the machine; the other ranks wait for it in the next
  collective, so keep ``[parallel].timeout_s`` above ``PAUSE_S``. A signal
  handler that returns does not cut the pause short, PEP 475);
- RANK: the global rank that fails; STEP: the optimizer step (1-based,
  counted as ``done``) at which it fails;
- WHERE: ``after_step`` (default: after that step's checkpoint, if any),
  ``in_checkpoint`` (after DeepSpeed wrote its shards, before the checkpoint
  is published), ``in_prune`` (the checkpoint of STEP is published, before
  older tags are moved or deleted), ``in_set_aside`` (a run resumed at STEP,
  0 for a fresh one, has pointed ``latest`` at the tag it continues, before
  it moves newer tags aside: checkpoint/line.py) or ``in_step`` (inside the
  optimizer step, after its backward passes, before its results are
  all-reduced).

Example: ``PLSH_FAULT=kill:1:3`` kills rank 1 right after step 3;
``PLSH_FAULT=sigterm:1:3:in_step`` sends rank 1 SIGTERM during step 3;
``PLSH_FAULT=pause:0:1`` holds rank 0 for ``PAUSE_S`` seconds after step 1 (its
metrics are written by then); a run resumed from step 1's checkpoint or a later one
does not pause again.
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
