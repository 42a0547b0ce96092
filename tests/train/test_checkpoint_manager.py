"""The set-up's two objects: ``resolve_run`` (config/resolved.py) and the ``CheckpointManager``
(checkpoint/manager.py) the training loop talks to for every checkpoint.

In-process, with a stand-in engine that writes one torch shard the way DeepSpeed does (as
test_checkpoint_line.py); loading into a real engine is test_resume.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from plsh_dist.checkpoint.line import ABANDONED, checkpoint_root, complete_tags
from plsh_dist.checkpoint.manager import CheckpointManager
from plsh_dist.checkpoint.run_shape import SAME_FILES, RunShape, run_shape
from plsh_dist.config import RunConfig, write_resolved
from plsh_dist.config.resolved import resolve_run

CPU = torch.device("cpu")


class _Engine:
    def save_checkpoint(self, root, tag, client_state, save_latest):
        path = Path(root) / tag
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"module": {"w": torch.zeros(8)}}, path / "mp_rank_00_model_states.pt")


def _cfg(tmp_path, resume="never", keep_last=2) -> RunConfig:
    cfg = RunConfig()
    cfg.run.out_dir = str(tmp_path / "run")
    cfg.run.device = "cpu"
    cfg.checkpoint.resume, cfg.checkpoint.keep_last = resume, keep_last
    return cfg


def test_resolve_run_resolves_once_what_the_set_up_reads(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.deepspeed.zero_stage, cfg.parallel.sp_size = 1, 2
    run = resolve_run(cfg, 4, CPU, rank=3)
    assert (run.precision, run.master_weights) == ("fp32", "fp32")  # "auto" on a CPU
    assert (run.dims.dp_size, run.dims.sp_size, run.rank) == (2, 2, 3)
    assert run.tokens_per_step == cfg.data.micro_batch_size * cfg.optim.grad_accum_steps * 2 * cfg.data.seq_len
    assert RunShape.of(run) == run_shape(cfg, 4, "cpu")  # the checkpoint's shape: the same values, not resolved again
    with pytest.raises(ValueError, match="sp_size=2 does not divide world_size=3"):
        resolve_run(cfg, 3, CPU)
    cfg.deepspeed.master_weights = "bf16"
    with pytest.raises(ValueError, match='precision = "auto" is fp32 on cpu'):
        resolve_run(cfg, 4, CPU)


def test_the_run_is_recorded_as_it_was_resolved(tmp_path):
    """The record ``accept`` writes is the resolved run's tables (taken once), the very files the config writes."""
    cfg = _cfg(tmp_path)
    run = resolve_run(cfg, 1, CPU)
    assert run.record == cfg.to_dict()
    CheckpointManager(run).accept(0)
    write_resolved(cfg, tmp_path / "direct")
    for name in ("config.resolved.toml", "config.resolved.json"):
        assert (run.out_dir / name).read_text() == (tmp_path / "direct" / name).read_text()


def test_the_manager_saves_prunes_and_finds_its_own_line_again(tmp_path):
    fresh = CheckpointManager(resolve_run(_cfg(tmp_path, keep_last=1), 1, CPU))
    assert fresh.find_resume() is None and fresh.load(_Engine()) == (0, 0)  # nothing to load: step 0, position 0
    assert not fresh.continues_out_dir and not fresh.load_universal
    fresh.accept(0)
    assert (Path(fresh.cfg.run.out_dir) / "config.resolved.json").is_file()  # the run's record
    for step in (1, 2, 3):
        tag_dir = fresh.save(_Engine(), step, loss=1.0 / step, consumed_sequences=8 * step, sources={})
    state = json.loads((tag_dir / "trainer_state.json").read_text())
    assert state == {"step": 3, "consumed_sequences": 24, "sources": {}, "loss": 1.0 / 3,
                     "shape": fresh.shape.to_dict()}
    root = checkpoint_root(fresh.cfg.run.out_dir)
    assert complete_tags(root) == ["step_00000003"]  # keep_last = 1
    assert "step_00000003" in fresh.valid_tags  # written here: pruning hashes it no more

    resumed = CheckpointManager(resolve_run(_cfg(tmp_path, resume=str(root / "step_00000003")), 1, CPU))
    assert resumed.find_resume() == (root, "step_00000003")
    assert resumed.route == SAME_FILES and resumed.continues_out_dir
    resumed.check_tokenizer("no tokenizer.model in the checkpoint: nothing to compare")


def test_accept_sets_the_abandoned_line_aside(tmp_path):
    manager = CheckpointManager(resolve_run(_cfg(tmp_path, keep_last=0), 1, CPU))
    for step in (1, 2, 3):
        manager.save(_Engine(), step, loss=None, consumed_sequences=step, sources={})
    again = CheckpointManager(resolve_run(_cfg(tmp_path, resume=str(manager.root / "step_00000001")), 1, CPU))
    again.find_resume()
    again.accept(1)  # resumed from step 1: 2 and 3 belong to a line this run abandons
    assert complete_tags(again.root) == ["step_00000001"]
    assert sorted(p.name for p in (again.root / ABANDONED).iterdir()) == ["step_00000002", "step_00000003"]
