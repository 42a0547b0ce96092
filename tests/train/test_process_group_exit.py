"""``train`` leaves the process group it joined, and only that one (loop.py, ``_holding_out_dir``).

A rank that exits with gloo's threads still running can die at exit with
"terminate called without an active exception" (SIGABRT) after a finished
run. A group the caller set up itself (tests/train/spawn.py) stays up for the
caller, which destroys it: the spawned-rank tests check that side.
"""

from __future__ import annotations

import subprocess
import sys

from tests.train.conftest import base_overrides
from tests.train.launcher_runs import ROOT, launcher_env

_SCRIPT = """
import sys
import torch.distributed as dist
from plsh_dist.config import load_config
from plsh_dist.train import train
train(load_config(None, sys.argv[1:]))
print("initialized after train:", dist.is_initialized())
"""


def test_a_run_that_joined_the_group_leaves_it(tiny_data, tmp_path):
    overrides = base_overrides(tiny_data, tmp_path / "run", "--run.max_steps=1", "--optim.warmup_steps=1",
                               "--logging.eval_batches=0")
    done = subprocess.run([sys.executable, "-c", _SCRIPT, *overrides], env=launcher_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "initialized after train: False" in done.stdout, done.stdout[-2000:]
