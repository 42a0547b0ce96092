"""The run directory's lock (run_lock.py) and the move of a previous run aside (run_dir.py), in-process.

Locks of other machines are written by hand: a holder record with another host name, its heartbeat
(the file's modification time) set with ``os.utime``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest

from plsh_dist.train import run_lock
from plsh_dist.train.run_dir import holds_a_run, previous_run_path, set_aside_previous_run
from plsh_dist.train.run_lock import LOCK_NAME, STALE_AFTER_S, Holder, OutDirBusy, RunDirLock, live_holder


def _write_lock(out_dir, holder: Holder, heartbeat_age_s: float = 0.0):
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_NAME
    path.write_text(json.dumps(dataclasses.asdict(holder)))
    t = time.time() - heartbeat_age_s
    os.utime(path, (t, t))
    return path


def _other_machine() -> Holder:
    return dataclasses.replace(Holder.this_process(), host="node-elsewhere", boot_id="other-boot", pid=1)


def test_acquire_writes_the_holder_and_release_removes_it_and_the_dir_it_made(tmp_path):
    out = tmp_path / "a" / "run"
    lock = RunDirLock.acquire(out)
    record = json.loads((out / LOCK_NAME).read_text())
    assert record["pid"] == os.getpid() and record["host"] == lock.holder.host and record["command"]
    assert [p.name for p in out.iterdir()] == [LOCK_NAME]  # the private file it was linked from is gone
    lock.release()
    assert not (tmp_path / "a").exists()  # both directories it created, empty again
    lock.release()  # idempotent


def test_release_keeps_an_out_dir_the_run_wrote_into(tmp_path):
    out = tmp_path / "run"
    lock = RunDirLock.acquire(out)
    (out / "metrics.jsonl").write_text("{}\n")
    lock.release()
    assert sorted(os.listdir(out)) == ["metrics.jsonl"]


def test_a_live_holder_refuses_naming_it(tmp_path):
    lock = RunDirLock.acquire(tmp_path)
    try:
        with pytest.raises(OutDirBusy) as err:
            RunDirLock.acquire(tmp_path)
        assert lock.holder.describe() in str(err.value) and "--run.out_dir" in str(err.value)
        assert lock.holder.describe() in live_holder(tmp_path)
    finally:
        lock.release()
    assert live_holder(tmp_path) is None


def test_another_machines_lock_holds_while_its_heartbeat_is_fresh(tmp_path):
    other = _other_machine()
    _write_lock(tmp_path, other, heartbeat_age_s=STALE_AFTER_S - 30)
    with pytest.raises(OutDirBusy) as err:
        RunDirLock.acquire(tmp_path)
    assert "host node-elsewhere" in str(err.value)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "node-elsewhere"  # untouched


def test_another_machines_lock_is_stale_once_its_heartbeat_is_old(tmp_path, capsys):
    _write_lock(tmp_path, _other_machine(), heartbeat_age_s=STALE_AFTER_S + 30)
    assert live_holder(tmp_path) is None
    lock = RunDirLock.acquire(tmp_path)
    try:
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == lock.holder.token
        err = capsys.readouterr().err
        assert "host node-elsewhere" in err and "is stale (its heartbeat is" in err and "taking it over" in err
    finally:
        lock.release()


def test_a_reused_pid_does_not_keep_a_dead_runs_lock(tmp_path, capsys):
    """Same machine, the pid alive, but it belongs to a process started later than the holder."""
    me = Holder.this_process()
    if not me.process_start:
        pytest.skip("no /proc here")
    _write_lock(tmp_path, dataclasses.replace(me, process_start=str(int(me.process_start) + 1), token="old"))
    lock = RunDirLock.acquire(tmp_path)
    lock.release()
    assert "the pid now belongs to another process" in capsys.readouterr().err


def test_an_unreadable_lock_is_stale(tmp_path, capsys):
    (tmp_path / LOCK_NAME).write_text("{not json")
    RunDirLock.acquire(tmp_path).release()
    assert "its record is unreadable" in capsys.readouterr().err


def test_the_heartbeat_touches_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    lock = RunDirLock.acquire(tmp_path)
    try:
        old = time.time() - 1000
        os.utime(lock.path, (old, old))
        time.sleep(0.5)
        assert time.time() - lock.path.stat().st_mtime < 5
    finally:
        lock.release()


def test_a_lock_taken_over_by_another_job_is_not_removed_by_the_old_holder(tmp_path):
    lock = RunDirLock.acquire(tmp_path)
    _write_lock(tmp_path, _other_machine())  # as if judged stale and taken over elsewhere
    lock.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "node-elsewhere"


def test_a_previous_run_moves_aside_whole_and_the_lock_stays_held(tmp_path):
    out = tmp_path / "run"
    lock = RunDirLock.acquire(out)
    try:
        assert not holds_a_run(out) and set_aside_previous_run(out, lock) is None  # only the lock: nothing to move
        (out / "checkpoints").mkdir()
        (out / "metrics.jsonl").write_text("{}\n")
        moved = set_aside_previous_run(out, lock)
        assert moved.parent == tmp_path and moved.name.startswith("run.previous-")
        assert sorted(os.listdir(moved)) == ["checkpoints", "metrics.jsonl"]  # no lock carried along
        assert os.listdir(out) == [LOCK_NAME] and json.loads(lock.path.read_text())["token"] == lock.holder.token
    finally:
        lock.release()
    assert os.listdir(out) == []


def test_previous_run_names_never_collide(tmp_path):
    out = tmp_path / "run"
    first = previous_run_path(out, now=0)
    first.mkdir()
    second = previous_run_path(out, now=0)
    assert second.name == first.name + "-2"
