"""``PLSH_FAULT`` (plsh_dist/faults.py): which rank, step and place a fault hits, and what ``pause`` does.

The other actions are exercised where they matter (kill, raise and hang by the
launcher-level runs, enospc by test_disk_full.py, the signals by the
preemption tests); these are the checks that need no process group.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from plsh_dist import faults


def test_a_spec_names_action_rank_step_and_place():
    assert faults._parse("pause:0:1") == ("pause", 0, 1, "after_step")
    assert faults._parse("pause:1:3:in_step") == ("pause", 1, 3, "in_step")
    assert faults._parse("kill:1:3") == ("kill", 1, 3, "after_step")


@pytest.mark.parametrize("spec", ["pause", "pause:0", "nap:0:1", "pause:0:1:in_lunch", "pause:0:1:after_step:x"])
def test_a_malformed_spec_is_refused_naming_the_actions(spec):
    with pytest.raises(ValueError, match=r"ACTION:RANK:STEP\[:WHERE\].*'pause'"):
        faults._parse(spec)


def test_pause_holds_only_its_rank_at_its_step_then_carries_on(monkeypatch, capsys):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    monkeypatch.setenv("PLSH_FAULT", "pause:0:1")
    faults.maybe_fail("after_step", 2, 0)  # a later step: a run resumed after step 1 does not pause
    faults.maybe_fail("after_step", 1, 1)  # another rank
    faults.maybe_fail("in_step", 1, 0)  # another place
    assert slept == []
    faults.maybe_fail("after_step", 1, 0)
    assert slept == [faults.PAUSE_S]
    assert capsys.readouterr().err == "PLSH_FAULT=pause:0:1: rank 0 pauses 20 s at step 1 (after_step)\n"
    monkeypatch.delenv("PLSH_FAULT")
    faults.maybe_fail("after_step", 1, 0)
    assert slept == [faults.PAUSE_S]


def test_a_signal_handled_during_the_pause_does_not_shorten_it(monkeypatch):
    """The preemption handler only sets a flag and returns; the pause then sleeps out its time
    (PEP 475), so the run is still training when a test's signal lands, and stops at the next step."""
    monkeypatch.setattr(faults, "PAUSE_S", 0.5)
    monkeypatch.setenv("PLSH_FAULT", "pause:0:1")
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    sender = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))  # the scheduler, mid-pause
    try:
        t0 = time.monotonic()
        sender.start()
        faults.maybe_fail("after_step", 1, 0)
        waited = time.monotonic() - t0
    finally:
        sender.join()
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [signal.SIGUSR1]
    assert waited >= 0.5
