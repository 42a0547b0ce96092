"""Pruning never leaves a run without its newest valid checkpoint (plsh_dist/checkpoint/line.py).

In-process, with a stand-in engine that writes one torch shard the way
DeepSpeed does. The invariant is checked at every moment: each rename and
delete the checkpoint code makes is intercepted, and before and after each one
the newest valid tag on disk must be at least the newest one the run had
(the tag it resumed from, then each tag it published). Kill points are
``PLSH_FAULT=raise:...`` (raise stands in for kill in-process: nothing after
the fault point runs either way). The launcher-level run of the same story is
``test_abandoned_line_launcher.py``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from plsh_dist.checkpoint import line as checkpoint_line
from plsh_dist.checkpoint.line import checkpoint_root, complete_tags, set_aside_newer, tag_for_step
from plsh_dist.checkpoint.manifest import verify_manifest
from plsh_dist.checkpoint.tags import find_resume, save_checkpoint
from plsh_dist.config import RunConfig


class _Engine:
    def save_checkpoint(self, root, tag, client_state, save_latest):
        path = Path(root) / tag
        path.mkdir(parents=True, exist_ok=True)
        step = client_state["trainer_state"]["step"]
        torch.save({"module": {"w": torch.full((64,), float(step))}}, path / "mp_rank_00_model_states.pt")


def _cfg(tmp_path, keep_last=2) -> RunConfig:
    cfg = RunConfig()
    cfg.run.out_dir = str(tmp_path / "run")
    cfg.checkpoint.keep_last = keep_last
    return cfg


def _save(cfg, step, valid_tags=None):
    return save_checkpoint(_Engine(), cfg, step, {"step": step}, "/nonexistent/tok.model", valid_tags)


def _corrupt(tag_dir: Path) -> None:
    shard = tag_dir / "mp_rank_00_model_states.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    shard.write_bytes(data)


def _valid(root: Path) -> list[int]:
    return [int(t[5:]) for t in complete_tags(root) if verify_manifest(root / t) == []]


class _Watch:
    """Checks the invariant before and after every rename and delete of the checkpoint code."""

    def __init__(self, root: Path, monkeypatch):
        self.root, self.newest, self.checks = root, 0, 0
        real_replace, real_rmtree = os.replace, shutil.rmtree

        def replace(src, dst, *a, **k):
            self.check()
            real_replace(src, dst, *a, **k)
            self.check()

        def rmtree(path, *a, **k):
            self.check()
            real_rmtree(path, *a, **k)
            self.check()

        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(shutil, "rmtree", rmtree)

    def check(self) -> None:
        self.checks += 1
        valid = _valid(self.root)
        assert valid and max(valid) >= self.newest, (
            f"no valid checkpoint >= step {self.newest} on disk at this moment: valid {valid}, "
            f"dir {sorted(p.name for p in self.root.iterdir())}")


def _make_history(cfg) -> Path:
    """Checkpoints 4 and 5 (keep_last = 2), then step 5 corrupted."""
    for step in range(1, 6):
        _save(cfg, step)
    root = checkpoint_root(cfg.run.out_dir)
    assert complete_tags(root) == [tag_for_step(4), tag_for_step(5)]
    _corrupt(root / tag_for_step(5))
    return root


def test_resume_from_an_earlier_tag_sets_the_newer_line_aside_and_keeps_the_good_one(tmp_path, monkeypatch):
    """The issue's story: 4 good, 5 corrupt; resume from 4, save 6 with keep_last = 2."""
    cfg = _cfg(tmp_path)
    root = _make_history(cfg)
    watch = _Watch(root, monkeypatch)
    watch.newest = 4  # the resumed-from tag (verified by the load)
    valid_tags = {tag_for_step(4)}

    moved = set_aside_newer(root, 4)
    assert moved == [root / "abandoned" / tag_for_step(5)]
    assert (root / "latest").read_text() == tag_for_step(4)
    for step in (5, 6, 7):
        _save(cfg, step, valid_tags)
        watch.newest = step
        watch.check()
    assert complete_tags(root) == [tag_for_step(6), tag_for_step(7)]
    assert _valid(root) == [6, 7]
    assert verify_manifest(root / "abandoned" / tag_for_step(5)) != []  # the corrupt one, moved, not deleted
    assert watch.checks > 10


def test_a_corrupt_tag_is_never_kept_even_without_the_set_aside(tmp_path):
    """Counting by number, saving 6 with keep_last = 2 kept the corrupt 5 and deleted the good 4
    (the issue's bug). Even with no set-aside (tags put there by hand), 5 fails its manifest:
    moved to damaged/, not counted, and 4 stays."""
    cfg = _cfg(tmp_path)
    root = _make_history(cfg)
    _save(cfg, 6)
    assert complete_tags(root) == [tag_for_step(4), tag_for_step(6)]
    assert _valid(root) == [4, 6]
    assert verify_manifest(root / "damaged" / tag_for_step(5)) != []


@pytest.mark.parametrize("fault", ["raise:0:4:in_set_aside", "raise:0:5:in_checkpoint", "raise:0:5:in_prune",
                                   "raise:0:6:in_prune"])
def test_a_kill_at_any_point_leaves_a_valid_checkpoint_and_auto_resumes_from_one(tmp_path, monkeypatch, fault):
    cfg = _cfg(tmp_path)
    root = _make_history(cfg)
    watch = _Watch(root, monkeypatch)
    watch.newest = 4
    monkeypatch.setenv("PLSH_FAULT", fault)
    with pytest.raises(RuntimeError, match="injected fault"):
        set_aside_newer(root, 4)
        valid_tags = {tag_for_step(4)}
        for step in (5, 6):
            _save(cfg, step, valid_tags)
            watch.newest = step
    monkeypatch.delenv("PLSH_FAULT")
    watch.check()
    load_dir, tag = find_resume("auto", cfg.run.out_dir)
    assert verify_manifest(load_dir / tag) == [], f"auto would resume from damaged {tag}"
    assert int(tag[5:]) == max(_valid(root)) >= watch.newest  # the newest valid one

    # The relaunch (resume auto) continues from there and ends with the newest valid tags.
    start = int(tag[5:])
    set_aside_newer(root, start)
    valid_tags = {tag}
    for step in range(start + 1, 8):
        _save(cfg, step, valid_tags)
        watch.newest = step
    assert _valid(root) == [6, 7] and complete_tags(root) == [tag_for_step(6), tag_for_step(7)]


def test_a_fresh_run_in_an_old_out_dir_sets_the_old_run_aside(tmp_path):
    """resume = "never" where another run left steps 1..5: its own step 1 must not be pruned."""
    cfg = _cfg(tmp_path)
    for step in range(1, 6):
        _save(cfg, step)
    root = checkpoint_root(cfg.run.out_dir)
    set_aside_newer(root, 0)  # what an accepted fresh run does
    assert not (root / "latest").exists() and complete_tags(root) == []
    assert sorted(p.name for p in (root / "abandoned").iterdir()) == [tag_for_step(4), tag_for_step(5)]
    _save(cfg, 1, set())
    assert complete_tags(root) == [tag_for_step(1)]
    # Set aside twice: the second one gets a suffix instead of replacing the first.
    _save(cfg, 4)
    _save(cfg, 5)
    set_aside_newer(root, 1)
    assert sorted(p.name for p in (root / "abandoned").iterdir()) == [
        tag_for_step(4), tag_for_step(4) + ".2", tag_for_step(5), tag_for_step(5) + ".2"]


def test_a_damaged_tag_in_the_keep_window_is_set_aside_and_not_counted(tmp_path):
    cfg = _cfg(tmp_path, keep_last=3)
    for step in (1, 2, 3):
        _save(cfg, step)
    root = checkpoint_root(cfg.run.out_dir)
    _corrupt(root / tag_for_step(2))
    _save(cfg, 4)
    assert complete_tags(root) == [tag_for_step(1), tag_for_step(3), tag_for_step(4)]  # 3 valid tags kept
    assert [p.name for p in (root / "damaged").iterdir()] == [tag_for_step(2)]


def test_known_valid_tags_are_not_hashed_again(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, keep_last=3)
    valid_tags: set[str] = set()
    for step in (1, 2, 3):
        _save(cfg, step, valid_tags)
    hashed = []
    real = checkpoint_line.verify_manifest
    monkeypatch.setattr(checkpoint_line, "verify_manifest", lambda d: hashed.append(d.name) or real(d))
    _save(cfg, 4, valid_tags)
    assert hashed == []
    _save(cfg, 5, None)  # no memory of earlier saves: the older kept tags are verified
    assert hashed == [tag_for_step(4), tag_for_step(3)]
