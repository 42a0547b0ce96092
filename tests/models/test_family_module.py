"""``[model].family_module``: a run names the module that registers its model family, and whatever
reads the run imports it, as ``[attention].sampler_module`` does for samplers (tests/test_sampler_module.py).

The family is transformers' Qwen2, the entry tests/models/test_new_family.py adds in-process, here
registered by a lab module in ``tmp_path``. The checks that need a process where nothing registered
it run in fresh processes; a bad or broken module is refused in-process (it registers nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plsh_dist.checkpoint.resume_check import trained_differences
from plsh_dist.config import config_from_table, write_resolved

ROOT = Path(__file__).resolve().parents[2]

LAB = '''
from plsh_dist.models.families import Family, register_family

register_family(Family(name="qwen2", class_prefix="Qwen2", hf_config="Qwen2Config", hf_model="Qwen2ForCausalLM",
                       hf_fields={"use_sliding_window": False},
                       presets={"qwen2-lab": dict(vocab_size=384, hidden_size=32, num_layers=2, num_heads=2,
                                                  num_kv_heads=1, head_dim=16, intermediate_size=64)}))
'''


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """``lab_families`` (registers Qwen2) and ``broken_families`` (imports what nobody has) in ``tmp_path``,
    on ``sys.path`` for this test and for the fresh processes it starts there."""
    (tmp_path / "lab_families.py").write_text(LAB)
    (tmp_path / "broken_families.py").write_text("import a_package_nobody_has  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_families", raising=False)
    return tmp_path


def _fresh(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter with the repository and ``cwd`` on ``sys.path`` and nothing else imported."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{cwd}"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_run_imports_the_module_that_registers_its_family_and_records_it(lab):
    """No launcher, no conftest: the family (and its preset) is known by the setting alone, and a fresh
    process reading the run's record imports the same module."""
    code = ("from plsh_dist.config import config_from_table, write_resolved\n"
            "try:\n    config_from_table({'model': {'family': 'qwen2'}})\n"
            "except ValueError as e:\n    print('REFUSED', e)\n"
            "cfg = config_from_table({'model': {'preset': 'qwen2-lab', 'family_module': 'lab_families'}})\n"
            "write_resolved(cfg, 'ck')\nprint('LOADED', cfg.model.family, cfg.model.num_layers)")
    done = _fresh(code, lab)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REFUSED model.family must be one of ('qwen3', 'llama', 'mistral'), got 'qwen2'" in done.stdout
    assert "[model].family_module" in done.stdout and done.stdout.rstrip().endswith("LOADED qwen2 2")
    assert 'family_module = "lab_families"' in (lab / "ck" / "config.resolved.toml").read_text()
    assert json.loads((lab / "ck" / "config.resolved.json").read_text())["model"]["family_module"] == "lab_families"

    again = _fresh("from plsh_dist.config import read_resolved\ncfg = read_resolved('ck')\n"
                   "print('READ', cfg.model.family, cfg.family_module)", lab)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.rstrip().endswith("READ qwen2 lab_families")


def test_unset_it_is_left_out_of_the_record(tmp_path):
    """A run without the setting writes the record it wrote before the setting existed."""
    cfg = config_from_table({})
    assert cfg.family_module is None and "family_module" not in cfg.to_dict()["model"]
    write_resolved(cfg, tmp_path)
    assert "family_module" not in (tmp_path / "config.resolved.toml").read_text()
    assert "family_module" not in (tmp_path / "config.resolved.json").read_text()


@pytest.mark.parametrize("module, message", [
    ("no_such_family_module", r"\[model\]\.family_module = 'no_such_family_module' cannot be imported: no module "
                              r"named 'no_such_family_module'.*register_family.*PYTHONPATH"),
    ("lab/families.py", r"\[model\]\.family_module must be a dotted module name"),
    ("", r"must be a dotted module name, got ''"),
])
def test_a_bad_module_name_is_refused_naming_the_setting_and_the_fix(lab, module, message):
    with pytest.raises(ValueError, match=message):
        config_from_table({"model": {"family_module": module}})


def test_a_module_that_is_there_but_broken_says_so(lab):
    """Its own error, not a refusal that hides it: the setting named the right module."""
    with pytest.raises(ModuleNotFoundError, match="a_package_nobody_has"):
        config_from_table({"model": {"family_module": "broken_families"}})


def test_a_resume_compares_the_family_not_where_its_module_lives():
    """A run written before the setting (the lab registered the family some other way) resumes with it set."""
    before = config_from_table({}).to_dict()
    now = {**before, "model": {**before["model"], "family_module": "lab_families"}}
    assert trained_differences(before, now) == []
    other = {**before, "model": {**before["model"], "family": "llama"}}
    assert [name for name, _, _ in trained_differences(before, other)] == ["[model].family"]


def test_pretrain_refuses_a_bad_module_before_any_work(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config",
                           str(ROOT / "configs" / "debug.toml"), "--model.family_module=no_such_family_module",
                           f"--run.out_dir={out}"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[model].family_module = 'no_such_family_module' cannot be imported" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
