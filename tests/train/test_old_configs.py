"""Configs and checkpoints written before a key was renamed still load, resume, evaluate and export.

``before_memory/config.resolved.json`` (and ``.toml``) was written by the code
before ``[memory]`` existed (``loss_chunk_tokens`` and ``activation_checkpointing``
then sat in ``[deepspeed]``), with non-default values for both. Each old key is
accepted with a one-line notice naming the new one (``RENAMED``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest

from plsh_dist.checkpoint.manifest import write_manifest
from plsh_dist.config import RENAMED, MemorySection, config_from_table, load_config, read_resolved, to_toml
from tests.train.conftest import base_overrides
from tests.train.spawn import run_training

OLD = Path(__file__).resolve().parent / "before_memory"
NOTICES = ["[deepspeed].activation_checkpointing is now [memory].activation_checkpointing",
           "[deepspeed].loss_chunk_tokens is now [memory].loss_chunk_tokens"]


def old_layout(table: dict) -> dict:
    """``table`` (this code's resolved config) written as the code before the renames wrote it."""
    out = {k: dict(v) for k, v in table.items()}
    for (old_sec, key), (new_sec, new_key) in RENAMED.items():
        out[old_sec][key] = out[new_sec].pop(new_key)
    # [memory] did not exist: its other keys were added since, and the old code ran at their defaults
    added = out.pop("memory", {})
    assert added == {k: v for k, v in dataclasses.asdict(MemorySection()).items() if k in added}, added
    return {k: v for k, v in out.items() if v}


def _keys(table: dict) -> set[tuple[str, str]]:
    return {(section, key) for section, values in table.items() for key in values}


def test_fixture_is_what_the_old_code_wrote():
    old = json.loads((OLD / "config.resolved.json").read_text())
    assert "memory" not in old and {"loss_chunk_tokens", "activation_checkpointing"} <= set(old["deepspeed"])
    # old_layout (used below on a fresh checkpoint) puts the renamed keys where the old code wrote
    # them, and keeps every other old key where it was (fields added since come on top).
    rewritten = old_layout(read_resolved(OLD).to_dict())
    assert "memory" not in rewritten and _keys(old) <= _keys(rewritten)


def test_old_resolved_config_loads_with_one_notice_per_renamed_key(capsys):
    cfg = read_resolved(OLD)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(any(n in line for line in err) for n in NOTICES)
    assert all(str(OLD / "config.resolved.json") in line for line in err)  # names the file to fix
    assert cfg.memory == MemorySection(activation_checkpointing=True, loss_chunk_tokens=16)
    assert cfg.deepspeed.zero_stage == 1 and cfg.deepspeed.precision == "fp32"
    cfg.validate(world_size=1)
    # Written again, it has the new layout, and reads back without a notice.
    again = config_from_table(cfg.to_dict())
    assert again == cfg and not capsys.readouterr().err
    assert "[memory]\nactivation_checkpointing = true\nloss_chunk_tokens = 16" in to_toml(cfg)


def test_old_toml_and_old_overrides_load_with_a_notice(capsys):
    cfg = load_config(OLD / "config.resolved.toml", ["--deepspeed.zero_stage=2"])
    assert cfg.memory == MemorySection(activation_checkpointing=True, loss_chunk_tokens=16)
    assert cfg.deepspeed.zero_stage == 2
    err = capsys.readouterr().err
    assert all(n in err for n in NOTICES) and "config.resolved.toml" in err
    assert load_config(None, ["--deepspeed.loss_chunk_tokens=0"]).memory.loss_chunk_tokens == 0
    assert NOTICES[1] in capsys.readouterr().err


def test_old_and_new_key_together_is_an_error():
    with pytest.raises(ValueError, match=r"both \[deepspeed\].loss_chunk_tokens and \[memory\].loss_chunk_tokens "
                                         r"are set; keep only \[memory\].loss_chunk_tokens"):
        load_config(None, ["--deepspeed.loss_chunk_tokens=0", "--memory.loss_chunk_tokens=16"])


@pytest.mark.slow
def test_checkpoint_from_before_resumes_evaluates_and_exports(tiny_data, tmp_path):
    """A step checkpoint whose resolved config has the old layout (manifest rewritten to match, as
    the old code would have hashed it): resuming replays the uninterrupted run exactly, and
    evaluation and conversion load it as trained."""
    from plsh_dist.checkpoint.export import convert_to_export
    from plsh_dist.checkpoint.loading import load_model

    common = ["--attention.bias=plsh", "--attention.num_samples=2", "--run.max_steps=4", "--checkpoint.keep_last=0",
              "--memory.loss_chunk_tokens=16"]
    full, stopped = run_training(1, base_overrides(tiny_data, tmp_path / "full", *common),
                                 base_overrides(tiny_data, tmp_path / "cut", *common), stop_after=[None, 2])
    tag = tmp_path / "cut" / "checkpoints" / "step_00000002"
    trained = read_resolved(tag)
    old = old_layout(trained.to_dict())
    (tag / "config.resolved.json").write_text(json.dumps(old, indent=2) + "\n")
    (tag / "config.resolved.toml").write_text(to_toml(old))
    write_manifest(tag)

    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert read_resolved(tag) == trained
    assert all(n in err.getvalue() for n in NOTICES)
    # The old key on the command line resumes too (same value, its notice only).
    resume = [c.replace("--memory.", "--deepspeed.") for c in common] + ["--checkpoint.resume=auto"]
    (resumed,) = run_training(1, base_overrides(tiny_data, tmp_path / "cut", *resume))
    assert stopped["losses"] == full["losses"][:2]
    assert resumed["first_step"] == 2 and resumed["losses"] == full["losses"][2:]

    ck = load_model(tag)
    assert ck.run_config == trained and ck.trained_attention == trained.attention
    out = convert_to_export(tag, tmp_path / "export")
    assert read_resolved(out) == trained
    assert "memory" in json.loads((out / "config.resolved.json").read_text())  # exports the new layout
    shutil.rmtree(tmp_path / "export")
