"""Resume refuses a config that would train a different model than the checkpoint holds.

The check reads the checkpoint's ``config.resolved.json`` (as ``write_resolved``
writes it at launch) and compares the fields that define the trained function.
"""

from __future__ import annotations

import dataclasses

import pytest

from plsh_dist.train.config import config_from_table, write_resolved
from plsh_dist.train.resume_check import check_resume_config, trained_differences

BASE = {"model": {"preset": "tiny"}, "attention": {"bias": "plsh", "num_samples": 8, "sampler": "iid"}}


def _cfg(**sections):
    table = {name: dict(values) for name, values in BASE.items()}
    for name, values in sections.items():
        table.setdefault(name, {}).update(values)
    return config_from_table(table)


@pytest.fixture
def tag_dir(tmp_path):
    write_resolved(_cfg(), tmp_path / "step_00000002")
    return tmp_path / "step_00000002"


def test_the_same_config_resumes(tag_dir):
    check_resume_config(_cfg(), tag_dir)


@pytest.mark.parametrize("change", [dict(attention={"method": "per_sample"}), dict(attention={"backend": "math"}),
                                    dict(attention={"chunk_size": 64}), dict(run={"max_steps": 99}),
                                    dict(parallel={"sp_size": 2}), dict(optim={"lr": 1e-4})])
def test_compute_only_and_schedule_fields_may_change(tag_dir, change):
    check_resume_config(_cfg(**change), tag_dir)


@pytest.mark.parametrize("change, field", [
    (dict(attention={"num_samples": 100}), "[attention].num_samples"),
    (dict(attention={"sampler": "stratified_ramp"}), "[attention].sampler"),
    (dict(attention={"sigma": 32.0}), "[attention].sigma"),
    (dict(attention={"bias": "alibi"}), "[attention].bias"),
    (dict(model={"num_layers": 2}), "[model].num_layers"),
    (dict(data={"document_masking": True}), "[data].document_masking"),
    (dict(run={"seed": 1}), "[run].seed"),
])
def test_a_changed_estimator_or_model_is_refused_naming_the_field(tag_dir, change, field):
    with pytest.raises(ValueError) as err:
        check_resume_config(_cfg(**change), tag_dir)
    msg = str(err.value)
    assert field in msg and "checkpoint" in msg and "resume" in msg and "init_from" in msg


def test_a_field_missing_from_an_old_checkpoint_takes_its_default(tag_dir):
    """A checkpoint written before a field existed has no key: it was trained with the field's default."""
    import json

    path = tag_dir / "config.resolved.json"
    table = json.loads(path.read_text())
    del table["data"]["document_masking"]
    path.write_text(json.dumps(table))
    check_resume_config(_cfg(), tag_dir)
    with pytest.raises(ValueError, match="document_masking"):
        check_resume_config(_cfg(data={"document_masking": True}), tag_dir)


def test_differences_list_every_field_with_both_values():
    saved, cfg = _cfg(), _cfg(attention={"num_samples": 20, "sampler": "stratified_ramp"})
    assert trained_differences(saved, cfg) == [("[attention].num_samples", 8, 20),
                                               ("[attention].sampler", "iid", "stratified_ramp")]
    assert trained_differences(saved, dataclasses.replace(saved)) == []


def test_a_checkpoint_without_its_config_is_left_to_the_manifest_check(tmp_path):
    check_resume_config(_cfg(attention={"num_samples": 3}), tmp_path)
