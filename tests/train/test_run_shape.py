"""What a resume may change about the cluster (checkpoint/run_shape.py): the route, or one line that refuses.

The routes themselves are exercised end to end in test_resume_shapes.py; here, the table: which
change takes which route, what is refused and what the refusal says, the shape a checkpoint was
written at (saved with it, or read from an older checkpoint), and a refused change through the
launcher: exit 2 before any work, nothing on disk changed.
"""

from __future__ import annotations

import json

import pytest

from plsh_dist.checkpoint.run_shape import SAME_FILES, UNIVERSAL, RunShape, change_notice, resume_route, saved_shape
from plsh_dist.config import load_config, write_resolved
from tests.train.conftest import base_overrides
from tests.train.test_refusals_launcher import _checkpoint_of, _launch, _snapshot, assert_refused


def _shape(world=2, sp=1, zero=1, precision="fp32", masters="fp32") -> RunShape:
    return RunShape(world_size=world, sp_size=sp, zero_stage=zero, precision=precision, master_weights=masters)


@pytest.mark.parametrize("now", [
    _shape(world=1), _shape(world=4), _shape(world=4, sp=2), _shape(zero=3), _shape(zero=2, world=8),
    _shape(precision="bf16"), _shape(precision="bf16", masters="bf16"), _shape(zero=3, precision="bf16"),
])
def test_any_change_between_zero_1_and_3_goes_through_the_universal_checkpoint(now):
    assert resume_route(_shape(), now, "ckpt") == UNIVERSAL
    assert resume_route(now, _shape(), "ckpt") == UNIVERSAL  # and back


def test_the_same_engine_layout_and_zero_0_at_any_world_read_the_checkpoints_own_files():
    assert resume_route(_shape(), _shape(), "ckpt") == SAME_FILES
    assert resume_route(_shape(world=2, sp=1), _shape(world=2, sp=2), "ckpt") == SAME_FILES  # DP 2 -> SP 2
    assert resume_route(_shape(zero=0, world=2), _shape(zero=0, world=4, sp=2), "ckpt") == SAME_FILES
    assert resume_route(_shape(zero=0, precision="bf16"), _shape(zero=0, world=1, precision="bf16"), "c") == SAME_FILES


@pytest.mark.parametrize("saved, now, expected", [
    (_shape(zero=0), _shape(zero=1), "[deepspeed].zero_stage = 1, the checkpoint was written at 0"),
    (_shape(zero=3), _shape(zero=0), "[deepspeed].zero_stage = 0, the checkpoint was written at 3"),
    (_shape(zero=0), _shape(zero=0, precision="bf16"),
     "[deepspeed].precision = 'bf16', the checkpoint was written in 'fp32' at ZeRO 0"),
])
def test_a_change_deepspeed_cannot_convert_is_refused_in_one_line(saved, now, expected):
    with pytest.raises(ValueError) as err:
        resume_route(saved, now, "runs/x/checkpoints/step_00000002")
    msg = str(err.value)
    assert expected in msg and "runs/x/checkpoints/step_00000002" in msg and "\n" not in msg
    assert "--deepspeed." in msg and "init_from" in msg  # the way out


def test_the_notice_names_both_shapes_and_a_rounding():
    line = change_notice(_shape(), _shape(world=1, zero=3, precision="bf16", masters="bf16"))
    assert "world 2 (DP 2 x SP 1), ZeRO 1, fp32 -> world 1 (DP 1 x SP 1), ZeRO 3, bf16 with bf16" in line
    assert "rounded to bf16" in line


def test_saved_shape_of_a_new_and_of_an_older_checkpoint(tmp_path):
    new = tmp_path / "new"
    new.mkdir()
    (new / "trainer_state.json").write_text(json.dumps({"step": 2, "shape": _shape(world=4, sp=2).to_dict()}))
    assert saved_shape(new, "cpu") == _shape(world=4, sp=2)

    old = tmp_path / "old"  # written before the shape was saved: its config, and one optimizer shard per rank
    write_resolved(load_config(None, ["--deepspeed.zero_stage=2", "--deepspeed.precision=bf16",
                                      "--parallel.sp_size=2"]), old)
    (old / "trainer_state.json").write_text(json.dumps({"step": 2}))
    for rank in range(4):
        (old / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    assert saved_shape(old, "cpu") == _shape(world=4, sp=2, zero=2, precision="bf16")
    assert saved_shape(tmp_path / "missing", "cpu") is None


def test_a_zero_0_checkpoint_resumed_at_zero_1_exits_2_before_any_work(tiny_data, tmp_path):
    out = tmp_path / "run"
    _checkpoint_of(base_overrides(tiny_data, out, "--deepspeed.zero_stage=0"), out, step=2)
    before = _snapshot(out)
    proc = _launch(tmp_path, base_overrides(tiny_data, out, "--deepspeed.zero_stage=1", "--checkpoint.resume=auto"),
                   "resume_zero0_to_zero1")
    assert_refused(proc, "resume", "[deepspeed].zero_stage = 1, the checkpoint was written at 0", out)
    assert _snapshot(out) == before
