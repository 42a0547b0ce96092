"""Resume refuses a config that would train a different model than the checkpoint holds.

The check reads the checkpoint's ``config.resolved.json`` (as ``write_resolved``
writes it at launch) and compares the fields that define the trained function.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plsh_dist.checkpoint.resume_check import check_resume_config, check_resume_steps, trained_differences
from plsh_dist.config import RunConfig, config_from_table, lr_at, write_resolved
from plsh_dist.config.resolved import resolve_run

BASE = {"model": {"preset": "tiny"}, "attention": {"bias": "plsh", "num_samples": 8, "sampler": "iid"}}


def _cfg(**sections):
    table = {name: dict(values) for name, values in BASE.items()}
    for name, values in sections.items():
        table.setdefault(name, {}).update(values)
    return config_from_table(table)


def _run(cfg: RunConfig):
    """``cfg`` resolved as the training set-up resolves it (the resume check reads the run's record)."""
    return resolve_run(cfg, cfg.parallel.sp_size, torch.device("cpu"))


@pytest.fixture
def tag_dir(tmp_path):
    write_resolved(_cfg(), tmp_path / "step_00000002")
    return tmp_path / "step_00000002"


def test_the_same_config_resumes(tag_dir):
    check_resume_config(_run(_cfg()), tag_dir)


@pytest.mark.parametrize("change", [dict(attention={"method": "per_sample"}), dict(attention={"backend": "math"}),
                                    dict(attention={"chunk_size": 64}), dict(run={"max_steps": 99}),
                                    dict(parallel={"sp_size": 2}), dict(optim={"lr": 1e-4})])
def test_compute_only_and_schedule_fields_may_change(tag_dir, change):
    check_resume_config(_run(_cfg(**change)), tag_dir)


@pytest.mark.parametrize("change, field", [
    (dict(attention={"num_samples": 100}), "[attention].num_samples"),
    (dict(attention={"sampler": "stratified_ramp"}), "[attention].sampler"),
    (dict(attention={"sigma": 32.0}), "[attention].sigma"),
    (dict(attention={"bias": "alibi"}), "[attention].bias"),
    (dict(model={"num_layers": 2}), "[model].num_layers"),
    (dict(data={"document_masking": True}), "[data].document_masking"),
    (dict(run={"seed": 1}), "[run].seed"),
    (dict(data={"seq_len": 512}), "[data].seq_len"),
])
def test_a_changed_estimator_or_model_is_refused_naming_the_field(tag_dir, change, field):
    with pytest.raises(ValueError) as err:
        check_resume_config(_run(_cfg(**change)), tag_dir)
    msg = str(err.value)
    assert field in msg and "checkpoint" in msg and "resume" in msg and "init_from" in msg


def test_a_field_missing_from_an_old_checkpoint_takes_its_default(tag_dir):
    """A checkpoint written before a field existed has no key: it was trained with the field's default."""
    import json

    path = tag_dir / "config.resolved.json"
    table = json.loads(path.read_text())
    del table["data"]["document_masking"]
    path.write_text(json.dumps(table))
    check_resume_config(_run(_cfg()), tag_dir)
    with pytest.raises(ValueError, match="document_masking"):
        check_resume_config(_run(_cfg(data={"document_masking": True})), tag_dir)


def test_differences_list_every_field_with_both_values():
    saved, cfg = _cfg(), _cfg(attention={"num_samples": 20, "sampler": "stratified_ramp"})
    assert trained_differences(saved.to_dict(), cfg.to_dict()) == [("[attention].num_samples", 8, 20),
                                                               ("[attention].sampler", "iid", "stratified_ramp")]
    assert trained_differences(saved.to_dict(), dataclasses.replace(saved).to_dict()) == []


def test_a_checkpoint_without_its_config_is_left_to_the_manifest_check(tmp_path):
    check_resume_config(_run(_cfg(attention={"num_samples": 3})), tmp_path)


# --- steps and learning-rate schedule ([run].max_steps, [optim]) ------------------------------------------

RUN_40 = dict(run={"max_steps": 40}, optim={"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5})


def _run_40(**changes):
    sections = {name: dict(values) for name, values in RUN_40.items()}
    for name, values in changes.items():
        sections.setdefault(name, {}).update(values)
    return _cfg(**sections)


def test_a_checkpoint_past_max_steps_is_refused():
    with pytest.raises(ValueError, match=r"trained 40 steps, more than \[run\].max_steps = 20.*--run.max_steps=40"):
        check_resume_steps(_run_40(), _run_40(run={"max_steps": 20}), 40, "ck")
    check_resume_steps(_run_40(), _run_40(), 40, "ck")  # at its end: nothing left to train, accepted


def test_extending_past_warmup_needs_the_decay_end_and_then_continues_at_min_lr():
    saved, longer = _run_40(), _run_40(run={"max_steps": 200})
    with pytest.raises(ValueError) as err:
        check_resume_steps(saved, longer, 40, "ck")
    assert "add --optim.decay_end=40" in str(err.value) and "checkpoint 40, this config 200" in str(err.value)
    with pytest.raises(ValueError, match="--optim.decay_end=40"):  # stopped half way: the same
        check_resume_steps(saved, longer, 20, "ck")
    kept = _run_40(run={"max_steps": 200}, optim={"decay_end": 40})
    check_resume_steps(saved, kept, 40, "ck")
    assert [lr_at(s, kept.optim, 200) for s in range(40)] == [lr_at(s, saved.optim, 40) for s in range(40)]
    assert {lr_at(s, kept.optim, 200) for s in range(40, 200)} == {3e-4}


def test_max_steps_may_change_until_a_step_past_the_peak_has_trained():
    """Warmup 5: steps 1..6 (the 6th at the peak, the cosine's start) do not depend on the decay's end."""
    check_resume_steps(_run_40(), _run_40(run={"max_steps": 200}), 6, "ck")
    with pytest.raises(ValueError, match="gives step 7, already trained"):
        check_resume_steps(_run_40(), _run_40(run={"max_steps": 200}), 7, "ck")


def test_a_changed_peak_rate_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"\[optim\].lr: checkpoint 0.003, this config 0.001"):
        check_resume_steps(_run_40(), _run_40(optim={"lr": 1e-3}), 3, "ck")


def test_the_checkpoint_step_comes_from_its_trainer_state(tmp_path):
    tag = tmp_path / "step_00000040"
    write_resolved(_run_40(), tag)
    (tag / "trainer_state.json").write_text('{"step": 40}')
    with pytest.raises(ValueError, match="--optim.decay_end=40"):
        check_resume_config(_run(_run_40(run={"max_steps": 200})), tag)
