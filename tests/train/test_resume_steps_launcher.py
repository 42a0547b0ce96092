"""What a resume refuses, through ``launchers/pretrain.py``: another sequence length, fewer steps
than the checkpoint has trained, and a learning-rate schedule that changes the rate of steps
already trained (resume_check.py).

Each refusal exits 2 with ``resume error:`` and the fix, and leaves the record (config.resolved.*)
and every other file unchanged; they use a checkpoint as a run leaves it on disk without weights
(the checks come before any weight is read): one quick launch each. Two tests train: with
``--optim.decay_end`` a run trains on past its planned end at min_lr, and the resolved config then
gives the logged rate of every step, old and new, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plsh_dist.config import lr_at, read_resolved
from tests.train.conftest import base_overrides
from tests.train.test_refusals_launcher import _checkpoint_of, _launch, _snapshot, assert_refused

pytestmark = pytest.mark.slow


def _resume(tiny_data, out: Path, *extra: str) -> list[str]:
    return base_overrides(tiny_data, out, "--checkpoint.resume=auto", *extra)


def _scheduled_lr(step: int, optim, max_steps: int) -> float:
    """The rate of 1-based ``step`` as the scheduler computes it (LambdaLR: base rate x ``lr_at`` / lr),
    bit for bit."""
    return optim.lr * (lr_at(step - 1, optim, max_steps) / optim.lr)


def _logged_lrs(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in records if "lr" in r}


def test_resume_at_another_sequence_length_exits_2(tiny_data, tmp_path):
    out = tmp_path / "run"
    _checkpoint_of(base_overrides(tiny_data, out), out, step=2)
    before = _snapshot(out)
    proc = _launch(tmp_path, _resume(tiny_data, out, "--data.seq_len=32"), "seq_len")
    assert_refused(proc, "resume", "[data].seq_len: checkpoint 64, this config 32", out)
    assert _snapshot(out) == before


def test_resume_with_max_steps_below_the_checkpoint_exits_2_and_keeps_the_record(tiny_data, tmp_path):
    """Before: "steps: 4 -> 2" and config.resolved.* rewritten to claim a 2-step run."""
    out = tmp_path / "run"
    _checkpoint_of(base_overrides(tiny_data, out), out, step=4)
    before = _snapshot(out)
    proc = _launch(tmp_path, _resume(tiny_data, out, "--run.max_steps=2"), "max_steps_down")
    assert_refused(proc, "resume", "it has trained 4 steps, more than [run].max_steps = 2", out)
    assert "--run.max_steps=4 or more" in proc.stderr
    assert _snapshot(out) == before and read_resolved(out).run.max_steps == 4


def test_extending_max_steps_without_saying_how_the_decay_ends_exits_2(tiny_data, tmp_path):
    """4 -> 8 steps would re-time the cosine of steps 3 and 4 (warmup is 2): refused, naming the flag."""
    out = tmp_path / "run"
    _checkpoint_of(base_overrides(tiny_data, out), out, step=4)
    before = _snapshot(out)
    proc = _launch(tmp_path, _resume(tiny_data, out, "--run.max_steps=8"), "extend")
    assert_refused(proc, "resume", "add --optim.decay_end=4", out)
    assert "end of the decay ([optim].decay_end, or [run].max_steps when decay_end = 0): checkpoint 4, " \
           "this config 8" in proc.stderr
    assert _snapshot(out) == before


def test_extending_with_decay_end_trains_the_new_steps_at_the_documented_rate(tiny_data, tmp_path):
    """6 steps planned (warmup 2); killed after step 4; resumed to 10 steps: refused without the flag
    (steps 3 and 4 would change rate), then with --optim.decay_end=6: steps 5 and 6 finish the
    cosine, 7..10 train at min_lr, and the resolved config gives every logged rate."""
    out = tmp_path / "run"
    first = _launch(tmp_path, base_overrides(tiny_data, out, "--run.max_steps=6", "--checkpoint.every_steps=1",
                                             "--logging.eval_batches=0"), "killed", PLSH_FAULT="kill:0:4")
    assert first.returncode == -9, first.stderr[-3000:]
    refused = _launch(tmp_path, _resume(tiny_data, out, "--run.max_steps=10", "--logging.eval_batches=0"), "no_flag")
    assert_refused(refused, "resume", "add --optim.decay_end=6", out)
    done = _launch(tmp_path, _resume(tiny_data, out, "--run.max_steps=10", "--optim.decay_end=6",
                                     "--logging.eval_batches=0"), "extended")
    assert done.returncode == 0, done.stderr[-3000:]
    record = read_resolved(out)
    assert (record.run.max_steps, record.optim.decay_end) == (10, 6)
    lrs = _logged_lrs(out)
    assert sorted(lrs) == list(range(1, 11))
    assert lrs == {s: _scheduled_lr(s, record.optim, record.run.max_steps) for s in lrs}  # exactly
    assert [lrs[s] for s in range(7, 11)] == pytest.approx([record.optim.min_lr] * 4, rel=1e-12)


def test_a_schedule_change_no_trained_step_sees_takes_effect_from_the_first_resumed_step(tiny_data, tmp_path):
    """Steps 1..3 (warmup 2, then the peak rate at the cosine's start) do not depend on where the decay
    ends, so 3 -> 7 steps is accepted, and step 4 must train at the 7-step schedule's rate (before:
    at the 3-step schedule's min_lr restored with the optimizer, and step 5 on at the 7-step one's)."""
    out = tmp_path / "run"
    first = _launch(tmp_path, base_overrides(tiny_data, out, "--run.max_steps=3", "--logging.eval_batches=0"),
                    "three_steps")
    assert first.returncode == 0, first.stderr[-3000:]
    done = _launch(tmp_path, _resume(tiny_data, out, "--run.max_steps=7", "--logging.eval_batches=0"), "seven")
    assert done.returncode == 0, done.stderr[-3000:]
    record = read_resolved(out)
    lrs = _logged_lrs(out)
    assert sorted(lrs) == list(range(1, 8))
    assert lrs == {s: _scheduled_lr(s, record.optim, 7) for s in lrs}
