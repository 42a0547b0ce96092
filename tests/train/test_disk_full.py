"""A full disk during a checkpoint: "disk full" and the path, the unfinished save removed, the
previous checkpoint kept, and a failure file that is whole or absent, never empty.

A full disk is injected: ``PLSH_FAULT=enospc:...`` (an ``OSError`` ENOSPC, as Python's writes
raise it) through the launcher, and for torch's zip writer, which loses the errno ("unexpected
pos ..."), a stand-in engine raising its message while the probe write gets ENOSPC. The advice
says what rerunning does under the run's [checkpoint].resume. Before any work, the launcher
refuses an out_dir whose filesystem has less free space than the checkpoints kept at once (the
free space faked by patching ``free_bytes``); the size it expects is checked against a real save.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plsh_dist.checkpoint.disk_full import DiskFullError, is_disk_full
from plsh_dist.checkpoint.line import checkpoint_root, complete_tags, tag_for_step
from plsh_dist.checkpoint.tags import save_checkpoint
from plsh_dist.config import RunConfig, load_config
from plsh_dist.plan import checkpoint_space as space_check
from plsh_dist.train.failure import report_failure
from tests.train.conftest import base_overrides
from tests.launchers import load_launcher
from tests.train.launcher_runs import PRETRAIN, empty_config, launcher_env

TORCH_WRITER = "[enforce fail at inline_container.cc:672] . unexpected pos 13504 vs 13398"


class _Engine:
    """Writes a shard like DeepSpeed; ``fail`` makes the write die as torch's zip writer does."""

    fail = False

    def save_checkpoint(self, root, tag, client_state, save_latest):
        path = Path(root) / tag
        path.mkdir(parents=True, exist_ok=True)
        (path / "mp_rank_00_model_states.pt").write_bytes(b"half a shard")
        if self.fail:
            raise RuntimeError(TORCH_WRITER)


def _save(cfg, step, engine):
    return save_checkpoint(engine, cfg, step, {"step": step}, tokenizer_path="/nonexistent/tok.model")


@pytest.fixture
def full_disk_probe(monkeypatch):
    """The probe write of ``is_disk_full`` meets a full disk (other writes are untouched)."""
    real_write = os.write

    def write(fd, data):
        if ".disk_probe_" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_torch_writer_failure_on_a_full_disk_says_disk_full(tmp_path, full_disk_probe):
    cfg = RunConfig()
    cfg.run.out_dir = str(tmp_path / "run")
    engine = _Engine()
    _save(cfg, 1, engine)
    engine.fail = True
    root = checkpoint_root(cfg.run.out_dir)
    with pytest.raises(DiskFullError) as err:
        _save(cfg, 2, engine)
    msg = str(err.value)
    assert msg.startswith(f"disk full: no space left to write checkpoint {root / 'step_00000002.partial'} (")
    assert f"the newest complete checkpoint, {root / tag_for_step(1)}, is intact" in msg
    assert TORCH_WRITER in repr(err.value.__cause__)  # the writer's own words stay in the traceback
    assert not (root / "step_00000002.partial").exists()  # its space freed for the report
    assert complete_tags(root) == [tag_for_step(1)] and (root / "latest").read_text() == tag_for_step(1)


def test_torch_writer_failure_with_space_left_is_not_called_disk_full(tmp_path):
    cfg = RunConfig()
    cfg.run.out_dir = str(tmp_path / "run")
    engine = _Engine()
    engine.fail = True
    with pytest.raises(RuntimeError, match="unexpected pos") as err:
        _save(cfg, 1, engine)
    assert not isinstance(err.value, DiskFullError)
    assert not is_disk_full(RuntimeError("a bug"), tmp_path)
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path)
    assert list(tmp_path.glob("**/.disk_probe_*")) == []


def test_failure_file_is_whole_or_absent_when_the_disk_is_full(tmp_path, capsys, monkeypatch):
    """The report itself cannot be written: it is on stderr, and no empty rank_R.txt is left."""
    real_open = io.open

    class _Full(io.TextIOWrapper):
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "w" in mode and "failures" in str(file):
            return _Full(handle.detach())
        return handle

    monkeypatch.setattr(io, "open", full_open)
    monkeypatch.setattr(builtins, "open", full_open)
    try:
        raise RuntimeError("the real error")
    except RuntimeError as exc:
        report_failure(exc, 0, tmp_path / "run")
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert "rank 0 failed: RuntimeError: the real error" in err
    assert "could not write" in err and "No space left on device" in err
    assert [p.name for p in (tmp_path / "run" / "failures").iterdir()] == []


def test_launcher_reports_disk_full_during_a_checkpoint(tiny_data, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(PRETRAIN), "--config", str(empty_config(tmp_path)),
           *base_overrides(tiny_data, out, "--run.max_steps=3", "--checkpoint.every_steps=1")]
    done = subprocess.run(cmd, env=launcher_env(PLSH_FAULT="enospc:0:2:in_checkpoint"), capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    root = checkpoint_root(out)
    partial = root / "step_00000002.partial"
    head = f"rank 0 failed: DiskFullError: disk full: no space left to write checkpoint {partial}"
    assert head in done.stderr
    assert (out / "failures" / "rank_0.txt").read_text().startswith(head)
    assert complete_tags(root) == [tag_for_step(1)] and not partial.exists()
    # The run says resume = "never": the same command would start over; the advice names --resume auto.
    assert ("run the same command with --resume auto (in place of any --resume or --checkpoint.resume it has): it "
            "resumes from there (as written, [checkpoint].resume = 'never' would move this run aside") in done.stderr
    # The size the space check expects, against the checkpoint written (fp32, ZeRO 0: 12 bytes a parameter).
    cfg = load_config(None, base_overrides(tiny_data, out))
    written = sum(p.stat().st_size for p in (root / tag_for_step(1)).rglob("*") if p.is_file())
    expected = space_check.checkpoint_space(cfg, device="cpu").checkpoint
    assert written <= expected <= 1.02 * written + 2**20, (written, expected)


@pytest.mark.parametrize("resume", ["auto", "never", "a checkpoint"])
def test_disk_full_advice_follows_the_resume_setting(tmp_path, full_disk_probe, resume):
    """Only resume = "auto" continues when the same command runs again; "never" or another checkpoint
    would move this run aside (checkpoints and all) and start over, needing the same space again."""
    cfg = RunConfig()
    cfg.run.out_dir = str(tmp_path / "run")
    other = tmp_path / "other" / "checkpoints" / tag_for_step(1)
    cfg.checkpoint.resume = {"auto": "auto", "never": "never", "a checkpoint": str(other)}[resume]
    engine = _Engine()
    _save(cfg, 1, engine)
    engine.fail = True
    with pytest.raises(DiskFullError) as err:
        _save(cfg, 2, engine)
    msg = str(err.value)
    tail = msg.split("Free space there (or move [run].out_dir to a larger disk) and run ", 1)[1]
    if resume == "auto":
        assert tail == "the same command again: it resumes from there"
    else:
        start = "step 0" if resume == "never" else str(other)
        assert tail == ("the same command with --resume auto (in place of any --resume or --checkpoint.resume it "
                        f"has): it resumes from there (as written, [checkpoint].resume = {cfg.checkpoint.resume!r} "
                        f"would move this run aside, its checkpoints with it, and start again from {start})")


def test_launcher_refuses_an_out_dir_without_room_for_the_checkpoints(tiny_data, tmp_path, monkeypatch, capsys):
    """keep_last = 2 and a checkpoint every step: 3 checkpoints on disk at once. 1 MiB free refuses the
    run before any work, with the figures; exit 2, nothing written."""
    out = tmp_path / "run"
    argv = ["--config", str(empty_config(tmp_path)),
            *base_overrides(tiny_data, out, "--checkpoint.every_steps=1", "--checkpoint.keep_last=2")]
    monkeypatch.setattr(space_check, "free_bytes", lambda directory: 2**20)
    assert load_launcher("pretrain").main(argv) == 2
    err = capsys.readouterr().err
    one = space_check.checkpoint_space(load_config(None, argv[2:]), device="cpu").checkpoint / 2**20
    assert err == (f"config error: [run].out_dir = {str(out)!r}: not enough free disk for the run's checkpoints: "
                   f"[checkpoint].keep_last = 2 keeps up to 3 checkpoints on disk at once (2 kept + the one being "
                   f"written); this run adds 3 of ~{one:,.1f} MiB each ({3 * one:,.1f} MiB), but its filesystem has "
                   f"1.0 MiB free. Free space there, lower [checkpoint].keep_last or raise [checkpoint].every_steps, "
                   f"or choose another [run].out_dir on a larger disk\n")
    assert not out.exists()


def test_checkpoints_counted_against_the_disk(tiny_data, tmp_path, monkeypatch):
    """How many new checkpoints a run holds at once: keep_last + 1, every one with keep_last = 0, fewer
    when the run writes fewer, and those of the out_dir a resume continues already on the disk."""
    out = tmp_path / "run"

    def new_at_once(*extra: str) -> int:
        return space_check.checkpoint_space(load_config(None, base_overrides(tiny_data, out, *extra)),
                                            device="cpu").new_at_once

    monkeypatch.chdir(tmp_path)
    assert new_at_once() == 1  # max_steps = 4, no periodic checkpoint: the final one
    assert new_at_once("--checkpoint.every_steps=1", "--checkpoint.keep_last=2") == 3
    assert new_at_once("--checkpoint.every_steps=1", "--checkpoint.keep_last=0") == 4
    assert new_at_once("--checkpoint.every_steps=2", "--checkpoint.keep_last=0") == 2
    for step in (1, 2):  # an earlier run's checkpoints, continued by resume = "auto"
        tag = checkpoint_root(out) / tag_for_step(step)
        tag.mkdir(parents=True)
        (tag / "trainer_state.json").write_text("{}")
    resumed = ("--checkpoint.every_steps=1", "--checkpoint.keep_last=2", "--checkpoint.resume=auto")
    assert new_at_once(*resumed) == 1  # 2 there + 1 being written, then pruned to 2
    assert new_at_once(*resumed[:2], "--checkpoint.resume=never") == 3  # moved aside: still on the disk
    space_check.check_checkpoint_space(load_config(None, base_overrides(tiny_data, out)), device="cpu")  # room here
