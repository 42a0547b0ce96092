"""``[attention].sampler_module``: a run names the module that registers its sampler, and whatever
reads the run imports it; nothing depends on what happens to be on ``PYTHONPATH`` or imported.

The suite's conftest imports the lab's samplers for every test, so the checks that need a process
where nothing registered them run in fresh processes; the others use a toy module in ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plsh_dist.config import config_from_table, read_resolved, write_resolved
from plsh_dist.models import AttentionConfig

ROOT = Path(__file__).resolve().parents[1]

TOY = '''
from plsh_dist.hashing import register_sampler

def draw(lsh, t, h):
    import numpy as np
    from plsh_dist.hashing import counter_uniform
    return -np.log(counter_uniform(lsh.seed, t, h, 0)) - np.log(counter_uniform(lsh.seed, t, h, 1)), \\
        counter_uniform(lsh.seed, t, h, 2)

register_sampler("toy_sampler", draw)
'''


@pytest.fixture
def toy_module(tmp_path, monkeypatch):
    """A module ``toy_sampler_module`` on ``sys.path`` that registers ``toy_sampler`` when imported;
    the registry and ``sys.modules`` are restored after the test."""
    from plsh_dist import hashing

    (tmp_path / "toy_sampler_module.py").write_text(TOY)
    (tmp_path / "broken_sampler_module.py").write_text("import a_package_nobody_has  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(hashing, "_SAMPLERS", dict(hashing._SAMPLERS))
    for name in ("toy_sampler_module", "broken_sampler_module"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return hashing


def test_the_config_imports_the_module_that_registers_its_sampler(toy_module):
    with pytest.raises(ValueError, match=r"got 'toy_sampler'.*name that module in \[attention\]\.sampler_module"):
        AttentionConfig(sampler="toy_sampler")
    cfg = AttentionConfig(sampler="toy_sampler", sampler_module="toy_sampler_module")
    assert "toy_sampler" in toy_module.sampler_names() and cfg.sampler_module == "toy_sampler_module"


def test_the_setting_is_written_with_the_run_and_read_back(toy_module, tmp_path):
    table = {"attention": {"sampler": "toy_sampler", "sampler_module": "toy_sampler_module"}}
    write_resolved(config_from_table(table), tmp_path / "ck")
    saved = json.loads((tmp_path / "ck" / "config.resolved.json").read_text())["attention"]
    assert saved["sampler"] == "toy_sampler" and saved["sampler_module"] == "toy_sampler_module"
    assert 'sampler_module = "toy_sampler_module"' in (tmp_path / "ck" / "config.resolved.toml").read_text()
    assert read_resolved(tmp_path / "ck").attention.sampler_module == "toy_sampler_module"
    write_resolved(config_from_table({}), tmp_path / "plain")  # unset: left out of the TOML (no null there)
    assert "sampler_module" not in (tmp_path / "plain" / "config.resolved.toml").read_text()
    assert read_resolved(tmp_path / "plain").attention.sampler_module is None


@pytest.mark.parametrize("module, message", [
    ("experiments.sampler", r"\[attention\]\.sampler_module = 'experiments\.sampler' cannot be imported: no module "
                            r"named 'experiments\.sampler'.*register_sampler.*PYTHONPATH"),
    ("no_such_sampler_module", r"cannot be imported: no module named 'no_such_sampler_module'"),
    ("experiments/samplers.py", r"\[attention\]\.sampler_module must be a dotted module name"),
    ("", r"must be a dotted module name, got ''"),
])
def test_a_bad_module_name_is_refused_naming_the_setting_and_the_fix(toy_module, module, message):
    with pytest.raises(ValueError, match=message):
        config_from_table({"attention": {"sampler": "toy_sampler", "sampler_module": module}})


def test_a_module_that_is_there_but_broken_says_so(toy_module):
    """Its own error, not a refusal that hides it: the setting named the right module."""
    with pytest.raises(ModuleNotFoundError, match="a_package_nobody_has"):
        AttentionConfig(sampler="toy_sampler", sampler_module="broken_sampler_module")


def _fresh(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter with the repository on ``sys.path`` and nothing else imported."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_experiments_samplers_load_by_the_setting_alone_in_a_fresh_process(tmp_path):
    """No launcher, no conftest: what the setting says is what is registered."""
    code = ("import sys; from plsh_dist.models import AttentionConfig\n"
            "try:\n    AttentionConfig(sampler='stratified_ramp')\nexcept ValueError as e:\n    print('REFUSED', e)\n"
            "assert 'experiments' not in sys.modules\n"
            "AttentionConfig(sampler='stratified_ramp', sampler_module='experiments.samplers')\nprint('LOADED')")
    done = _fresh(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REFUSED attention.sampler must be one of ('iid', 'stratified')" in done.stdout
    assert "[attention].sampler_module" in done.stdout and done.stdout.rstrip().endswith("LOADED")


def test_pretrain_refuses_a_bad_module_before_any_work(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config",
                           str(ROOT / "configs" / "debug.toml"), "--attention.sampler=stratified_ramp",
                           "--attention.sampler_module=experiments.sampler", f"--run.out_dir={out}"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[attention].sampler_module = 'experiments.sampler' cannot be imported" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_evaluate_refuses_a_bad_sampler_module_option(tmp_path, capsys):
    """``--sampler-module``: for a spec naming a sampler the checkpoint does not, or an older checkpoint."""
    from tests.launchers import load_launcher

    rc = load_launcher("evaluate").main(["--checkpoint", str(tmp_path / "none"), "--lengths", "64",
                                         "--sampler-module", "no_such_sampler_module", "--out", str(tmp_path / "e")])
    assert rc == 2
    assert "--sampler-module = 'no_such_sampler_module' cannot be imported" in capsys.readouterr().err


def test_a_resume_compares_the_sampler_not_where_its_module_lives(toy_module):
    """A run written before the setting (the lab imported some other way) resumes with it set."""
    from plsh_dist.checkpoint.resume_check import trained_differences

    toy_module.import_sampler_module("toy_sampler_module")
    before = config_from_table({"attention": {"sampler": "toy_sampler"}})
    now = config_from_table({"attention": {"sampler": "toy_sampler", "sampler_module": "toy_sampler_module"}})
    assert trained_differences(before.to_dict(), now.to_dict()) == []
