"""A [tokenizer].model_path that does not exist trains a new tokenizer there: the launcher says so."""

from __future__ import annotations

import subprocess
import sys

from tests.train.conftest import base_overrides
from tests.train.launcher_runs import PRETRAIN, empty_config, launcher_env


def test_launcher_says_it_trains_a_new_tokenizer(tiny_data, tmp_path):
    new = tmp_path / "tok" / "new.model"
    cmd = [sys.executable, str(PRETRAIN), "--config", str(empty_config(tmp_path)),
           *base_overrides(tiny_data, tmp_path / "run", "--run.max_steps=1", "--optim.warmup_steps=1",
                           f"--tokenizer.model_path={new}")]
    done = subprocess.run(cmd, env=launcher_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"tokenizer {new} does not exist: training a new 512-piece tokenizer there from the training data"
            in done.stderr), done.stderr[-3000:]
    assert new.is_file()
