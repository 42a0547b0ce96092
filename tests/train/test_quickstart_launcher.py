"""``launchers/quickstart.py --fresh`` (what ``make quickstart`` runs) checks first, then replaces.

Before: it deleted the run's out_dir before any check, so a bad config or bad data lost the
previous run and ended in a traceback (exit 1). Now a bad config or bad data exits 2 with one
message and the previous run untouched; an out_dir a live run holds is refused; and once the checks
pass, the previous run is moved aside and deleted only when every step has passed, so a failure in
training keeps it (through the deepspeed launcher). Every test starts the launcher: ``make test-slow``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from plsh_dist.train.run_lock import RunDirLock
from tests.train.launcher_runs import ROOT, Finished, launcher_env, run
from tests.train.test_refusals_launcher import _snapshot

pytestmark = pytest.mark.slow

QUICKSTART = ROOT / "launchers" / "quickstart.py"
_TIMEOUT_S = 600


def _quickstart(tmp_path: Path, name: str, *args: str) -> Finished:
    return run([sys.executable, str(QUICKSTART), "--fresh", *args], launcher_env(), tmp_path / "logs", name,
               _TIMEOUT_S)


def _previous_run(out: Path) -> dict[str, str]:
    (out / "checkpoints" / "step_00000100").mkdir(parents=True)
    (out / "checkpoints" / "step_00000100" / "trainer_state.json").write_text('{"step": 100}')
    (out / "metrics.jsonl").write_text('{"step": 100, "loss": 2.0}\n')
    (out / "final").mkdir()
    (out / "final" / "model.safetensors").write_bytes(b"weights")
    return _snapshot(out)


def _assert_refused_keeping(proc: Finished, kind: str, out: Path, before: dict[str, str]) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{text[-3000:]}"
    assert text.count(f"{kind} error: ") == 1 and "Traceback" not in text, text[-3000:]
    assert _snapshot(out) == before
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(out.name + ".previous-")] == []


def test_bad_data_exits_2_and_keeps_the_previous_run(tiny_data, tmp_path):
    out, empty = tmp_path / "quickstart", tmp_path / "empty.txt"
    empty.write_text("")
    before = _previous_run(out)
    proc = _quickstart(tmp_path, "bad_data", *tiny_data, f"--run.out_dir={out}", f"--data.train_files=['{empty}']",
                       f"--data.cache_dir={tmp_path / 'cache'}")
    _assert_refused_keeping(proc, "data", out, before)
    assert f"no usable data file among ['{empty}']" in proc.stderr


def test_a_bad_config_exits_2_and_keeps_the_previous_run(tiny_data, tmp_path):
    out = tmp_path / "quickstart"
    before = _previous_run(out)
    proc = _quickstart(tmp_path, "bad_config", *tiny_data, f"--run.out_dir={out}", "--optim.lr=-1")
    _assert_refused_keeping(proc, "config", out, before)
    assert "[optim].lr must be > 0" in proc.stderr


def test_an_out_dir_in_use_is_not_replaced(tiny_data, tmp_path):
    out = tmp_path / "quickstart"
    before = _previous_run(out)
    lock = RunDirLock.acquire(out)  # a live run (this test process) holds it
    try:
        proc = _quickstart(tmp_path, "busy", *tiny_data, f"--run.out_dir={out}")
        before["run.lock"] = _snapshot(out)["run.lock"]
        _assert_refused_keeping(proc, "out_dir", out, before)
        assert "is in use by another run" in proc.stderr
    finally:
        lock.release()


def test_a_failed_training_keeps_the_previous_run_aside_and_says_where(tiny_data, tmp_path):
    """One process for an SP = 2 config: training is refused (exit 2) after the checks passed."""
    out = tmp_path / "quickstart"
    before = _previous_run(out)
    proc = _quickstart(tmp_path, "training_fails", "--nproc", "1", *tiny_data, f"--run.out_dir={out}",
                       "--parallel.sp_size=2")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("quickstart.previous-")]
    assert len(moved) == 1 and _snapshot(moved[0]) == before
    assert f"training failed (exit 2); the previous run is kept at {moved[0]}" in proc.stderr
