"""Safe checkpoints: atomic publishing, partial saves ignored, damaged files named, no unpickling.

The unit tests drive ``save_checkpoint`` with a stand-in engine that writes a
torch file the way DeepSpeed does (one process, no process group); the last
test trains a real DeepSpeed ZeRO-1 engine in spawned processes, SIGKILLs it
inside a checkpoint save, and resumes.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from plsh_dist.checkpoint.line import checkpoint_root, complete_tags, tag_for_step
from plsh_dist.checkpoint.manifest import MANIFEST, verify_manifest
from plsh_dist.checkpoint.safe_load import CheckpointLoadError, SafeLoadCheckpointEngine, safe_torch_load
from plsh_dist.checkpoint.tags import find_resume, load_checkpoint, save_checkpoint
from plsh_dist.config import RunConfig
from tests.train.conftest import base_overrides
from tests.train.spawn import run_training


class _FakeEngine:
    """What ``save_checkpoint`` needs of a DeepSpeed engine: write a shard under ``root/tag``."""

    def __init__(self):
        self.saved_tags: list[str] = []

    def save_checkpoint(self, root, tag, client_state, save_latest):
        assert save_latest is False  # ``latest`` is ours to move, last
        path = Path(root) / tag
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"module": {"w": torch.arange(4.0)}, **client_state}, path / "mp_rank_00_model_states.pt")
        self.saved_tags.append(tag)


def _cfg(tmp_path, keep_last=0) -> RunConfig:
    cfg = RunConfig()
    cfg.run.out_dir = str(tmp_path / "run")
    cfg.checkpoint.keep_last = keep_last
    return cfg


def _save(cfg, step):
    return save_checkpoint(_FakeEngine(), cfg, step, {"step": step}, tokenizer_path="/nonexistent/tok.model")


class _Payload:
    """A pickle that would run ``touch <marker>`` when unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ---------------------------------------------------------------- safe loading


def test_malicious_pickle_is_refused_not_executed(tmp_path):
    marker, bad = tmp_path / "pwned", tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {}, "extra": _Payload(marker)}, bad)
    for load in (safe_torch_load, SafeLoadCheckpointEngine(inner=None).load):
        with pytest.raises(CheckpointLoadError, match="refused to unpickle") as err:
            load(str(bad), map_location="cpu")
        assert str(bad) in str(err.value) and "posix.system" in str(err.value)
        assert not marker.exists(), "the payload ran: loading must never unpickle arbitrary callables"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing"])
def test_damaged_file_error_names_the_file(tmp_path, damage):
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"w": torch.randn(1000)}, path)
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:700])
    elif damage == "garbage":
        path.write_bytes(b"not a checkpoint at all" * 10)
    else:
        path.unlink()
    with pytest.raises(CheckpointLoadError) as err:
        safe_torch_load(path, advice="Resume with --resume never.")
    assert str(path) in str(err.value) and "--resume never" in str(err.value)
    assert ("does not exist" if damage == "missing" else "damaged or truncated") in str(err.value)
    assert "weights_only` set to `False`" not in str(err.value)  # torch's unsafe retry hint is not passed on


def test_safe_load_reads_tensors_and_deepspeed_classes(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    state = {"w": torch.arange(3.0), "zero_stage": ZeroStageEnum.optimizer_states, "loss_scaler": LossScaler(1.0),
             "param_slice_mappings": [{"w": fragment_address(numel=3, start=0)}]}
    torch.save(state, tmp_path / "s.pt")
    back = safe_torch_load(tmp_path / "s.pt")
    assert torch.equal(back["w"], state["w"]) and back["zero_stage"] == ZeroStageEnum.optimizer_states
    assert back["param_slice_mappings"][0]["w"] == fragment_address(numel=3, start=0)


class _PickledByName:
    """An Enum member as Python 3.11.0-3.11.4 pickle it (Debian 12's 3.11.2, the CPU image): getattr(cls, name)."""

    def __init__(self, cls, name: str):
        self.cls, self.name = cls, name

    def __reduce_ex__(self, proto):
        return getattr, (self.cls, self.name)


def test_safe_load_reads_enums_pickled_by_name_and_refuses_other_getattr(tmp_path):
    """The CPU image could not resume its own checkpoints: their ZeroStageEnum was pickled as getattr."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    torch.save({"zero_stage": _PickledByName(ZeroStageEnum, "optimizer_states")}, tmp_path / "old.pt")
    assert safe_torch_load(tmp_path / "old.pt")["zero_stage"] is ZeroStageEnum.optimizer_states
    for cls, name in ((LossScaler, "__init__"), (ZeroStageEnum, "__class__"), (int, "from_bytes")):
        torch.save({"x": _PickledByName(cls, name)}, tmp_path / "bad.pt")
        with pytest.raises(CheckpointLoadError, match="not a member of a safe Enum|outside the safe list"):
            safe_torch_load(tmp_path / "bad.pt")


# ---------------------------------------------------------------- atomic saves


def test_save_publishes_atomically_with_manifest(tmp_path):
    cfg = _cfg(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        tag_dir = _save(cfg, step)
    root = checkpoint_root(cfg.run.out_dir)
    assert complete_tags(root) == [tag_for_step(2), tag_for_step(3)]  # keep_last=2 pruned step 1
    assert (root / "latest").read_text() == tag_for_step(3)
    assert sorted(p.name for p in root.iterdir()) == ["latest", tag_for_step(2), tag_for_step(3)]  # no leftovers
    listed = json.loads((tag_dir / MANIFEST).read_text())["files"]
    assert set(listed) == {"mp_rank_00_model_states.pt", "config.resolved.toml", "config.resolved.json",
                           "trainer_state.json"}
    assert verify_manifest(tag_dir) == []


def test_failure_inside_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, caplog):
    """A rank dying between DeepSpeed's write and the publish (``raise`` stands in for
    ``kill`` in-process; nothing after the fault point runs either way)."""
    cfg = _cfg(tmp_path)
    _save(cfg, 2)
    monkeypatch.setenv("PLSH_FAULT", "raise:0:4:in_checkpoint")
    with pytest.raises(RuntimeError, match="injected fault"):
        _save(cfg, 4)
    root = checkpoint_root(cfg.run.out_dir)
    assert (root / "step_00000004.partial" / "mp_rank_00_model_states.pt").is_file()
    assert (root / "latest").read_text() == tag_for_step(2)
    with caplog.at_level(logging.WARNING):
        assert find_resume("auto", cfg.run.out_dir) == (root, tag_for_step(2))
    assert "step_00000004.partial" in caplog.text  # says what it ignored

    # The replayed run saves step 4 again: the stale partial dir is replaced, not mixed in.
    monkeypatch.delenv("PLSH_FAULT")
    _save(cfg, 4)
    assert complete_tags(root) == [tag_for_step(2), tag_for_step(4)]
    assert not (root / "step_00000004.partial").exists()
    assert find_resume("auto", cfg.run.out_dir) == (root, tag_for_step(4))


def test_find_resume_ignores_partial_dirs_and_follows_latest(tmp_path, caplog):
    root = checkpoint_root(tmp_path)
    for name in ("step_00000002", "step_00000003", "step_00000009.partial", "step_00000001.deleting"):
        (root / name).mkdir(parents=True)
        (root / name / "trainer_state.json").write_text("{}")  # even a nearly finished partial dir is ignored
    (root / "latest").write_text("step_00000002")
    assert find_resume("auto", tmp_path) == (root, "step_00000002")
    (root / "latest").write_text("step_00000009.partial")  # a pointer to an unfinished dir is not followed
    with caplog.at_level(logging.WARNING):
        assert find_resume("auto", tmp_path) == (root, "step_00000003")
    assert "step_00000009.partial" in caplog.text
    (root / "latest").unlink()
    assert find_resume("auto", tmp_path) == (root, "step_00000003")
    assert find_resume("never", tmp_path) is None
    assert find_resume("auto", tmp_path / "elsewhere") is None
    with pytest.raises(ValueError, match="unfinished checkpoint"):
        find_resume(str(root / "step_00000009.partial"), tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_manifest_names_the_damaged_file(tmp_path, damage):
    tag_dir = _save(_cfg(tmp_path), 1)
    shard = tag_dir / "mp_rank_00_model_states.pt"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # a bit flip in tensor bytes loads silently without the checksum
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(data)
    else:
        shard.unlink()
    (problem,) = verify_manifest(tag_dir)
    assert str(shard) in problem


def test_load_refuses_a_damaged_tag_before_deepspeed_reads_it(tmp_path):
    cfg = _cfg(tmp_path)
    _save(cfg, 1)
    tag_dir = _save(cfg, 2)
    shard = tag_dir / "mp_rank_00_model_states.pt"
    shard.write_bytes(shard.read_bytes()[:100])

    class _MustNotLoad:
        checkpoint_engine = None

        def load_checkpoint(self, *args, **kwargs):
            raise AssertionError("DeepSpeed must not read a tag whose manifest check failed")

    with pytest.raises(CheckpointLoadError) as err:
        load_checkpoint(_MustNotLoad(), tag_dir.parent, tag_dir.name)
    assert str(shard) in str(err.value) and "truncated" in str(err.value)
    assert f"--resume={tag_dir.parent / tag_for_step(1)}" in str(err.value)


# ---------------------------------------------------------------- real engine


def test_kill_inside_checkpoint_then_resume_real_engine(tiny_data, tmp_path, monkeypatch):
    """ZeRO-1 run SIGKILLed after DeepSpeed wrote step 3's shards: resume starts at step 2
    and replays the uninterrupted run exactly (same floats); then a truncated
    optimizer shard stops the resume with an error naming it, raised by the
    safe loader DeepSpeed reads through (the manifest is removed so DeepSpeed
    gets to read the file)."""
    common = ["--deepspeed.zero_stage=1", "--run.max_steps=4", "--checkpoint.every_steps=1",
              "--checkpoint.keep_last=0", "--logging.eval_batches=0"]
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    root = checkpoint_root(cut_dir)
    monkeypatch.setenv("PLSH_FAULT", "kill:0:3:in_checkpoint")
    with pytest.raises(mp.ProcessExitedException):
        run_training(1, base_overrides(tiny_data, cut_dir, *common))
    monkeypatch.delenv("PLSH_FAULT")
    assert (root / "step_00000003.partial").is_dir() and complete_tags(root)[-1] == tag_for_step(2)

    full, resumed = run_training(1, base_overrides(tiny_data, full_dir, *common),
                                 base_overrides(tiny_data, cut_dir, *common, "--checkpoint.resume=auto"))
    assert resumed["first_step"] == 2
    assert resumed["losses"] == full["losses"][2:]  # exact: same data, masks and optimizer state
    assert resumed["grad_norms"] == full["grad_norms"][2:]
    assert complete_tags(root) == [tag_for_step(s) for s in (1, 2, 3, 4)]

    shard = root / tag_for_step(2) / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:1000])
    (root / tag_for_step(2) / MANIFEST).unlink()
    with pytest.raises(mp.ProcessRaisedException, match="zero_pp_rank_0_mp_rank_00_optim_states.pt") as err:
        run_training(1, base_overrides(tiny_data, cut_dir, *common,
                                       f"--checkpoint.resume={root / tag_for_step(2)}"))
    assert "CheckpointLoadError" in str(err.value) and "damaged or truncated" in str(err.value)
    assert f"--resume={root / tag_for_step(1)}" in str(err.value)
