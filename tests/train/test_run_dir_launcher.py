"""One run directory, one run, through ``launchers/pretrain.py``: the lock and a fresh start in a
used out_dir.

- A live run's lock refuses a second job (exit 2, ``out_dir error:`` naming the holder's host, pid,
  start and command; nothing changes on disk); a lock whose holder was killed with SIGKILL is named
  stale and taken over, and the run proceeds; also with two real training runs, and with a
  two-process job whose rank 1 must refuse too instead of waiting for rank 0.
- ``--resume never`` in a used out_dir moves the whole previous run aside, every byte intact.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plsh_dist.train.run_lock import LOCK_NAME, RunDirLock
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import PRETRAIN, ROOT, Launch, empty_config, launcher_env
from tests.train.test_refusals_launcher import _checkpoint_of, _launch, _snapshot, assert_refused

pytestmark = pytest.mark.slow

_TIMEOUT_S = 300


# --- the lock -------------------------------------------------------------------------------------------


def test_a_second_job_on_a_locked_out_dir_exits_2_naming_the_holder(tiny_data, tmp_path):
    out = tmp_path / "run"
    _checkpoint_of(base_overrides(tiny_data, out), out, step=2)
    lock = RunDirLock.acquire(out)  # held by this (live) test process
    try:
        before = _snapshot(out)
        proc = _launch(tmp_path, base_overrides(tiny_data, out, "--checkpoint.resume=auto"), "second_job")
        assert_refused(proc, "out_dir", f"pid {os.getpid()} on host {socket.gethostname()}", out)
        assert "is in use by another run" in proc.stderr and "pytest" in proc.stderr  # the holder's command
        assert lock.holder.describe() in proc.stderr  # its start time too
        assert _snapshot(out) == before
    finally:
        lock.release()
    assert not (out / LOCK_NAME).exists()


def _killed_holder(out: Path) -> int:
    """A process that takes ``out``'s lock and is then killed with SIGKILL; returns its pid."""
    code = ("import importlib.util, sys, time\n"  # run_lock.py alone: no torch import, a quick start
            "spec = importlib.util.spec_from_file_location('run_lock', sys.argv[2])\n"
            "run_lock = sys.modules['run_lock'] = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(run_lock)\n"
            "run_lock.RunDirLock.acquire(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out), str(ROOT / "plsh_dist/train/run_lock.py")],
                              cwd=str(ROOT), env=launcher_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()  # SIGKILL: no clean-up runs
        holder.wait()
    assert (out / LOCK_NAME).is_file()
    return holder.pid


def test_a_lock_left_by_a_killed_run_is_named_stale_and_taken_over(tiny_data, tmp_path):
    out = tmp_path / "run"
    pid = _killed_holder(out)
    proc = _launch(tmp_path, base_overrides(tiny_data, out, "--run.max_steps=1", "--optim.warmup_steps=1",
                                            "--logging.eval_batches=0"),
                   "after_kill")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"the lock pid {pid} on host {socket.gethostname()}" in proc.stderr
    assert "is stale (its process is gone); taking it over" in proc.stderr
    assert not (out / LOCK_NAME).exists()  # released at the end
    assert (out / "metrics.jsonl").is_file()


def test_two_runs_on_one_out_dir_the_second_is_refused_and_a_killed_run_leaves_no_lock(tiny_data, tmp_path):
    """The trial's story: run A trains; run B starts on the same out_dir with --resume never and is
    refused (before the fix both ran and mixed their checkpoints and metrics); A is killed with
    SIGKILL; run C says A's lock is stale and finishes."""
    out = tmp_path / "run"
    config = empty_config(tmp_path)
    a = Launch([sys.executable, str(PRETRAIN), "--config", str(config),
                *base_overrides(tiny_data, out, "--run.max_steps=100000", "--logging.eval_batches=0")],
               launcher_env(), tmp_path / "logs", "a")
    try:
        deadline = time.time() + _TIMEOUT_S
        while not (out / "metrics.jsonl").is_file():  # A holds the lock and trains
            assert a.proc.poll() is None and time.time() < deadline, (tmp_path / "logs" / "a.err").read_text()
            time.sleep(0.5)
        before = (out / "config.resolved.json").read_text()
        b = _launch(tmp_path, base_overrides(tiny_data, out, "--run.max_steps=3"), "b")
        assert_refused(b, "out_dir", f"pid {a.proc.pid} on host {socket.gethostname()}", out)
        assert "launchers/pretrain.py" in b.stderr and "--run.max_steps=100000" in b.stderr  # A's command
        assert a.proc.poll() is None  # A still trains, its record untouched
        assert (out / "config.resolved.json").read_text() == before
    finally:
        os.killpg(a.proc.pid, signal.SIGKILL)
        a.wait(_TIMEOUT_S)
    assert (out / LOCK_NAME).is_file()  # kill -9 cannot release it
    c = _launch(tmp_path, base_overrides(tiny_data, out, "--run.max_steps=2", "--logging.eval_batches=0"), "c")
    assert c.returncode == 0, c.stderr[-3000:]
    assert f"the lock pid {a.proc.pid} on host" in c.stderr and "is stale (its process is gone)" in c.stderr
    assert not (out / LOCK_NAME).exists()


def test_every_rank_of_a_two_process_job_refuses_a_locked_out_dir(tiny_data, tmp_path):
    """Only rank 0 takes the lock; rank 1 learns the verdict and exits 2 too, at once (no wait in a
    collective for a rank 0 that has left)."""
    from tests.train.launcher_runs import run, torchrun_cmd

    out = tmp_path / "run"
    lock = RunDirLock.acquire(out)
    try:
        proc = run(torchrun_cmd(2, empty_config(tmp_path), base_overrides(tiny_data, out, "--data.micro_batch_size=1")),
                   launcher_env(), tmp_path / "logs", "two_ranks", _TIMEOUT_S)
    finally:
        lock.release()
    text = proc.stdout + proc.stderr
    codes = sorted(re.findall(r"exitcode\s*:\s*(-?\d+) \(pid", text))  # torchrun's summary, one per rank
    assert proc.returncode != 0 and codes == ["2", "2"], text[-3000:]
    assert text.count("out_dir error: ") == 1 and f"pid {os.getpid()}" in text, text[-3000:]
    assert proc.wall_s < 120, proc.wall_s


# --- a fresh start in a used out_dir ---------------------------------------------------------------------


def test_resume_never_moves_the_whole_previous_run_aside_intact(tiny_data, tmp_path):
    """Before: metrics.jsonl was truncated and final/ overwritten; eval/ stayed, describing weights
    that no longer existed."""
    out = tmp_path / "run"
    _checkpoint_of(base_overrides(tiny_data, out), out, step=2)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5.0}) + "\n" for s in range(1, 9)))
    (out / "final").mkdir()
    (out / "final" / "model.safetensors").write_bytes(b"previous weights")
    (out / "eval").mkdir()
    (out / "eval" / "results.json").write_text("{}")
    before = _snapshot(out)
    proc = _launch(tmp_path, base_overrides(tiny_data, out, "--run.max_steps=1", "--optim.warmup_steps=1",
                                            "--logging.eval_batches=0"), "fresh")
    assert proc.returncode == 0, proc.stderr[-3000:]
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run.previous-")]
    assert len(moved) == 1, sorted(p.name for p in tmp_path.iterdir())
    assert _snapshot(moved[0]) == before  # every file, byte for byte
    assert f"moved it, whole and unchanged, to {moved[0]}" in proc.stdout
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    assert not (out / "final").exists() and not (out / "eval").exists()
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step_00000001"]
