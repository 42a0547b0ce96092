"""A checkpoint resumes at another cluster shape: DP size, ZeRO stage, precision (checkpoint/run_shape.py).

"Resumes" means, for each change below:
- **the state carries over exactly**: after DeepSpeed's universal checkpoint is loaded at the new
  shape, every parameter's gathered fp32 master weights and AdamW moments equal (``torch.equal``)
  what the checkpoint's own shape loads from the checkpoint's own files; pure data movement.
  Master weights changed to bf16 are those values rounded to bf16, and nothing else;
- **the data stream continues** at the global position the checkpoint's run stopped at (no
  sequence read twice or skipped: tests/data/test_sampler.py holds the stream itself);
- **the schedule continues**: the first resumed step's learning rate is the uninterrupted run's;
- **the loss curve continues**: the resumed steps' losses equal the uninterrupted run's at the old
  shape to 2e-5 relative in fp32. Not bit for bit: another number of ranks sums the gradient (and
  the logged loss) in another order, and ZeRO-3 gathers and reduces in other buckets; in fp32
  that moves the last bits (1e-7 relative per step), which Adam's step amplifies over two steps
  to a few 1e-6. In bf16, 2e-2: its rounding (3 significant digits) where fp32's was;
- **the tag stays as it was**: its manifest still verifies, and the conversion sits beside it.
"""

from __future__ import annotations

import json

import pytest
import torch

from plsh_dist.checkpoint.manifest import verify_manifest
from plsh_dist.checkpoint.universal import universal_path
from tests.train.conftest import base_overrides
from tests.train.spawn import run_setup, run_training

TAG = "step_00000002"


def _shape(zero: int, micro: int, precision: str = "fp32", masters: str = "fp32") -> list[str]:
    return [f"--deepspeed.zero_stage={zero}", f"--data.micro_batch_size={micro}",
            f"--deepspeed.precision={precision}", f"--deepspeed.master_weights={masters}"]


def _resume_at(tiny_data, tmp_path, before: tuple[int, list[str]], after: tuple[int, list[str]]):
    """Train 4 steps at ``before`` = (world, shape flags); the same run stopped after step 2 and
    resumed at ``after`` -> (uninterrupted, resumed results, the stopped run's out_dir)."""
    common = ["--checkpoint.keep_last=0", "--attention.bias=plsh", "--attention.num_samples=2"]
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full, _ = run_training(before[0], base_overrides(tiny_data, full_dir, *common, *before[1]),
                           base_overrides(tiny_data, cut_dir, *common, *before[1]), stop_after=[None, 2])
    (resumed,) = run_training(after[0], base_overrides(tiny_data, cut_dir, *common, *after[1],
                                                       "--checkpoint.resume=auto"))
    return full, resumed, cut_dir


def _check_continues(full, resumed, cut_dir, rel):
    assert resumed["first_step"] == 2
    assert resumed["losses"] == pytest.approx(full["losses"][2:], rel=rel)
    tag_dir = cut_dir / "checkpoints" / TAG
    assert verify_manifest(tag_dir) == []  # the original tag is untouched
    state = json.loads((tag_dir / "trainer_state.json").read_text())
    assert state["consumed_sequences"] == 2 * 4  # 2 steps of a global batch of 4 sequences


def test_dp2_resumes_at_dp1_with_its_state_data_and_schedule(tiny_data, tmp_path):
    """The issue's case: DP = 2, ZeRO-1, resumed by one process (micro-batch 4: the same global batch)."""
    full, resumed, cut_dir = _resume_at(tiny_data, tmp_path, (2, _shape(1, 2)), (1, _shape(1, 4)))
    _check_continues(full, resumed, cut_dir, rel=2e-5)
    assert (universal_path(cut_dir / "checkpoints" / TAG) / "zero").is_dir()

    common = ["--checkpoint.keep_last=0", "--attention.bias=plsh", "--attention.num_samples=2",
              "--checkpoint.resume=" + str(cut_dir / "checkpoints" / TAG)]
    own = run_setup(2, base_overrides(tiny_data, tmp_path / "own", *common, *_shape(1, 2)))
    moved = run_setup(1, base_overrides(tiny_data, tmp_path / "moved", *common, *_shape(1, 4)))
    _same_state(own, moved)


def _same_state(own: dict, moved: dict, rounded_to=None) -> None:
    assert moved["start_step"] == own["start_step"] == 2
    assert moved["position"] == own["position"] == 8
    assert moved["lr"] == own["lr"]
    assert own["state"].keys() == moved["state"].keys()
    for name, tensors in own["state"].items():
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            want = tensors[key] if rounded_to is None else tensors[key].to(rounded_to).float()
            assert torch.equal(moved["state"][name][key].float(), want), (name, key)


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [
    ((2, _shape(1, 2)), (2, _shape(3, 2))),    # ZeRO-1 -> ZeRO-3
    ((2, _shape(3, 2)), (1, _shape(1, 4))),    # ZeRO-3 -> ZeRO-1, and DP 2 -> 1
    ((2, _shape(2, 2)), (4, _shape(2, 1))),    # DP 2 -> 4
    ((2, _shape(0, 2)), (1, _shape(0, 4))),    # ZeRO 0: the checkpoint's own files at another DP size
    ((2, _shape(1, 2)), (2, [*_shape(1, 4), "--parallel.sp_size=2"])),  # DP 2 -> SP 2: the same files
], ids=["zero1-to-zero3", "zero3-to-zero1-dp1", "dp2-to-dp4", "zero0-dp2-to-dp1", "dp2-to-sp2"])
def test_resume_across_zero_stages_and_dp_sizes(tiny_data, tmp_path, before, after):
    full, resumed, cut_dir = _resume_at(tiny_data, tmp_path, before, after)
    _check_continues(full, resumed, cut_dir, rel=2e-5)
    common = ["--checkpoint.keep_last=0", "--attention.bias=plsh", "--attention.num_samples=2",
              "--checkpoint.resume=" + str(cut_dir / "checkpoints" / TAG)]
    _same_state(run_setup(before[0], base_overrides(tiny_data, tmp_path / "own", *common, *before[1])),
                run_setup(after[0], base_overrides(tiny_data, tmp_path / "moved", *common, *after[1])))


@pytest.mark.slow
def test_fp32_resumes_in_bf16_with_fp32_masters(tiny_data, tmp_path):
    full, resumed, cut_dir = _resume_at(tiny_data, tmp_path, (2, _shape(1, 2)), (2, _shape(1, 2, "bf16")))
    _check_continues(full, resumed, cut_dir, rel=2e-2)
    common = ["--checkpoint.keep_last=0", "--attention.bias=plsh", "--attention.num_samples=2",
              "--checkpoint.resume=" + str(cut_dir / "checkpoints" / TAG)]
    own = run_setup(2, base_overrides(tiny_data, tmp_path / "own", *common, *_shape(1, 2)))
    moved = run_setup(2, base_overrides(tiny_data, tmp_path / "moved", *common, *_shape(1, 2, "bf16")))
    _same_state(own, moved)  # fp32 masters: the very values
    for name, tensors in own["state"].items():  # the model's bf16 weights: the masters rounded
        assert torch.equal(moved["state"][name]["model"], tensors["fp32"].to(torch.bfloat16)), name


@pytest.mark.slow
def test_bf16_master_weights_resume_as_fp32_masters_at_zero3(tiny_data, tmp_path, capfd):
    """The issue's silent case: a bf16-master ZeRO-1 checkpoint resumed with fp32 masters at ZeRO-3 is
    converted (and says so); the fp32 masters and moments are the bf16 ones, exactly (bf16 -> fp32
    is exact)."""
    before, after = (2, _shape(1, 2, "bf16", "bf16")), (2, _shape(3, 2, "bf16", "fp32"))
    full, resumed, cut_dir = _resume_at(tiny_data, tmp_path, before, after)
    assert "resume at another shape: world 2 (DP 2 x SP 1), ZeRO 1, bf16 with bf16 master weights -> " \
           "world 2 (DP 2 x SP 1), ZeRO 3, bf16 with fp32 master weights" in capfd.readouterr().out
    _check_continues(full, resumed, cut_dir, rel=2e-2)
    common = ["--checkpoint.keep_last=0", "--attention.bias=plsh", "--attention.num_samples=2",
              "--checkpoint.resume=" + str(cut_dir / "checkpoints" / TAG)]
    _same_state(run_setup(before[0], base_overrides(tiny_data, tmp_path / "own", *common, *before[1])),
                run_setup(after[0], base_overrides(tiny_data, tmp_path / "moved", *common, *after[1])))
