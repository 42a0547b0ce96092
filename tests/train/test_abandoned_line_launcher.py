"""The issue's story through ``launchers/pretrain.py`` (slow): a corrupt newest checkpoint, a resume
from the one before, kills at the checkpoint code's fault points, and a valid checkpoint on disk
after every one of them.

1. steps 1..5 with a checkpoint every step and ``keep_last = 2``: tags 4 and 5; then one bit of
   step 5's weights is flipped;
2. ``--resume auto`` picks step 5: refused (exit 2, ``checkpoint error``, advice to resume from
   step 4), nothing on disk changes;
3. ``--resume=<step 4>`` killed right after pointing ``latest`` at step 4, before setting step 5
   aside (``kill:0:4:in_set_aside``);
4. ``--resume auto`` (step 4 now) killed after publishing the new step 5, before pruning
   (``kill:0:5:in_prune``);
5. ``--resume auto`` to step 7: tags 6 and 7, both valid; the corrupt step 5 kept under
   ``checkpoints/abandoned/``.

After each launch, a valid checkpoint is on disk and ``resume = "auto"`` names the newest valid
one (from step 3 on). Before the fix, pruning counted tags by number and deleted the good step 4
while keeping the corrupt step 5. The in-process version, which also checks the moments between
the kill points, is test_checkpoint_line.py.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from plsh_dist.checkpoint.line import checkpoint_root, complete_tags, tag_for_step
from plsh_dist.checkpoint.manifest import verify_manifest
from plsh_dist.checkpoint.tags import find_resume
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import PRETRAIN, Finished, empty_config, launcher_env, run
from tests.train.test_refusals_launcher import assert_refused

_TIMEOUT_S = 300


def _launch(tiny_data, tmp_path: Path, out: Path, name: str, *extra: str, fault: str | None = None) -> Finished:
    # Planned for 5 steps, run on to 7: the decay ends at step 5 (a resume keeps the run's schedule).
    overrides = base_overrides(tiny_data, out, "--checkpoint.every_steps=1", "--checkpoint.keep_last=2",
                               "--logging.eval_batches=0", "--optim.decay_end=5", *extra)
    cmd = [sys.executable, str(PRETRAIN), "--config", str(empty_config(tmp_path)), *overrides]
    return run(cmd, launcher_env(**({"PLSH_FAULT": fault} if fault else {})), tmp_path / "logs", name, _TIMEOUT_S)


def _valid_steps(root: Path) -> list[int]:
    return [int(t[5:]) for t in complete_tags(root) if verify_manifest(root / t) == []]


def _auto_is_newest_valid(out: Path) -> None:
    load_dir, tag = find_resume("auto", out)
    assert verify_manifest(load_dir / tag) == [], f"resume auto would pick the damaged {tag}"
    assert int(tag[5:]) == max(_valid_steps(load_dir))


def _snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_resume_before_a_corrupt_checkpoint_never_leaves_the_run_without_a_valid_one(tiny_data, tmp_path):
    out = tmp_path / "run"
    root = checkpoint_root(out)
    first = _launch(tiny_data, tmp_path, out, "1_steps_1_to_5", "--run.max_steps=5")
    assert first.returncode == 0, first.stderr[-3000:]
    assert complete_tags(root) == [tag_for_step(4), tag_for_step(5)]
    shard = root / tag_for_step(5) / "mp_rank_00_model_states.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(data)
    assert _valid_steps(root) == [4]

    before = _snapshot(out)
    refused = _launch(tiny_data, tmp_path, out, "2_auto_refused", "--run.max_steps=7", "--checkpoint.resume=auto")
    assert_refused(refused, "checkpoint", f"--resume={root / tag_for_step(4)}", out)
    assert _snapshot(out) == before

    killed = _launch(tiny_data, tmp_path, out, "3_set_aside_killed", "--run.max_steps=7",
                     f"--checkpoint.resume={root / tag_for_step(4)}", fault="kill:0:4:in_set_aside")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert _valid_steps(root) == [4] and (root / "latest").read_text() == tag_for_step(4)
    _auto_is_newest_valid(out)

    killed = _launch(tiny_data, tmp_path, out, "4_prune_killed", "--run.max_steps=7", "--checkpoint.resume=auto",
                     fault="kill:0:5:in_prune")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert _valid_steps(root) == [4, 5] and complete_tags(root) == [tag_for_step(4), tag_for_step(5)]
    _auto_is_newest_valid(out)

    done = _launch(tiny_data, tmp_path, out, "5_to_step_7", "--run.max_steps=7", "--checkpoint.resume=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    # no tensorboard/ or final/: not written
    assert f"outputs: {out} (metrics.jsonl, training_curves.png, checkpoints/)" in done.stdout
    assert complete_tags(root) == [tag_for_step(6), tag_for_step(7)] and _valid_steps(root) == [6, 7]
    _auto_is_newest_valid(out)
    abandoned = root / "abandoned" / tag_for_step(5)
    assert verify_manifest(abandoned) != []  # the corrupt one: set aside, never deleted, never counted
    assert not (out / "failures").exists()
