"""A full disk during a checkpoint: "disk full" and the path, the unfinished save removed, the
previous checkpoint kept, and a failure file that is whole or absent, never empty.

A full disk is injected: ``PLSH_FAULT=enospc:...`` (an ``OSError`` ENOSPC, as Python's writes
raise it) through the launcher, and for torch's zip writer, which loses the errno ("unexpected
pos ..."), a stand-in engine raising its message while the probe write gets ENOSPC.
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
from plsh_dist.config import RunConfig
from plsh_dist.train.failure import report_failure
from tests.train.conftest import base_overrides
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
