"""Preemption: SIGTERM / SIGUSR1 make every rank finish its step, checkpoint and exit ``EXIT_PREEMPTED``.

With ``[checkpoint].save_on_signal = true`` (the default) the handler only sets a flag
(``StopRequest.signum``; ``SA_RESTART``, so blocked C++ reads and writes resume); the ranks add it
to the step's existing all-reduce, so all stop after the same step and save through the atomic
checkpoint path; Ctrl-C takes the same path once the first step has begun, a second one aborts.
Why this design, its edge cases (a signal before the first step, during a save, in the last
step), what it costs and how each launcher answers: docs/training.md, "Preemption", "How it works".
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

logger = logging.getLogger(__name__)

EXIT_PREEMPTED = 75
"""Exit code of a rank that stopped on SIGTERM / SIGUSR1 after writing a checkpoint.
75 is sysexits' EX_TEMPFAIL ("temporary failure, try again"): distinct from the
shell's 128 + N of a process killed by a signal (143 for SIGTERM), which says
nothing about whether a checkpoint was written."""

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)
DEFAULT_UNTIL_ARMED: tuple[signal.Signals, ...] = (signal.SIGTERM,)
"""Stop signals that end the rank at once (their default action) until the first step begins."""


class StopRequest:
    """Which stop signal this process received (0 = none). Written by the handler only."""

    def __init__(self) -> None:
        self.signum = 0
        self.armed = False
        """Set when the first step begins: from then on Ctrl-C saves (module doc); before, it aborts."""
        self._on_arm: list = []

    def arm(self) -> None:
        """The first step begins: Ctrl-C now saves, and SIGTERM sets the flag instead of ending the rank."""
        self.armed = True
        for install in self._on_arm:
            install()
        self._on_arm.clear()

    @property
    def requested(self) -> bool:
        return self.signum != 0

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "none"


@contextmanager
def handle_stop_signals(enabled: bool = True) -> Iterator[StopRequest]:
    """Install the flag-setting handler for ``STOP_SIGNALS`` for the duration of the block.

    Yields the ``StopRequest`` the handler writes. ``enabled=False`` yields a
    request that is never set and gives the signals their default action (the
    process dies), also where a parent left them ignored (``slurm_pretrain.sh``
    starts torchrun with SIGUSR1 ignored, and its ranks inherit that). Outside
    the main thread (Python installs handlers only there) nothing is changed.
    The previous handlers are restored on exit.
    """
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        if enabled:
            logger.warning("not in the main thread: SIGTERM/SIGUSR1 keep their current action (no checkpoint "
                           "on preemption)")
        yield stop
        return

    def on_stop_signal(signum, frame):  # noqa: ARG001 - no work here: the loop acts at the end of the step
        stop.signum = signum

    announce = os.environ.get("RANK", "0") == "0"

    def on_interrupt(signum, frame):  # noqa: ARG001
        if not stop.armed:
            raise KeyboardInterrupt  # nothing trained yet: abort as Python's own handler does
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts
        if not stop.requested:
            stop.signum = signum
            if announce:  # os.write: unbuffered, safe wherever the handler lands (no reentrant print)
                os.write(2, b"\nCtrl-C: every rank finishes its step and writes a checkpoint, then exits "
                            b"75; press Ctrl-C again to abort at once without saving\n")

    previous = {}
    try:
        def install(sig: signal.Signals) -> None:
            signal.signal(sig, on_stop_signal)
            signal.siginterrupt(sig, False)  # SA_RESTART: interrupted system calls resume

        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, signal.SIG_DFL)
            if enabled and sig in DEFAULT_UNTIL_ARMED:
                stop._on_arm.append(lambda sig=sig: install(sig))
            elif enabled:
                install(sig)
        if enabled:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_interrupt)
            signal.siginterrupt(signal.SIGINT, False)
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def interrupt_ends_at_once() -> Iterator[None]:
    """Ctrl-C (SIGINT) takes its default action inside the block: for C++ waits before the first step
    (joining the process group), where Python's KeyboardInterrupt would wait for the call to return."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


PREEMPTED_MARKER_ENV = "PLSH_PREEMPTED_MARKER"


def mark_preempted() -> None:
    """Create the file named by ``$PLSH_PREEMPTED_MARKER``, if set: this rank stopped for preemption.

    For launchers that cannot pass the ranks' 75 on: torchrun reports any failed
    rank as 1, so ``launchers/slurm_pretrain.sh`` (which sets the variable to a
    file on the node that runs the batch script, the job's first node) reads the
    marker to tell a preemption, which it requeues, from a crash, which it does
    not. Every rank creates it on its own node; the ranks of one node write the
    same path (an empty file: creating it twice is harmless)."""
    path = os.environ.get(PREEMPTED_MARKER_ENV)
    if path:
        with open(path, "a"):
            pass


def ignore_stop_signals() -> None:
    """For a rank leaving after its preemption checkpoint: further SIGTERM / SIGUSR1 are ignored.

    When the first rank exits 75, deepspeed's and torchrun's launchers SIGTERM the
    ranks still shutting down; without this their status would read "killed by
    SIGTERM" (-15) although their checkpoint is written. SIGKILL (the launchers
    send it after a grace period) still ends a shutdown that hangs."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def preempted_line(step: int, tag_dir, local: StopRequest, signalled_ranks: int, world: int) -> str:
    """The one line rank 0 prints when the run stops on a signal."""
    who = (f"{local.name}" if local.requested else "a stop signal") + f" on {signalled_ranks} of {world} rank(s)"
    what = "interrupted (Ctrl-C)" if local.signum == signal.SIGINT else "preempted"
    return (f"{what} at step {step} ({who}): checkpoint {tag_dir} written; resume with the same command "
            f"(--resume auto, the default, continues from it); exit code {EXIT_PREEMPTED}")
