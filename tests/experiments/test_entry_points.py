"""Every study's command runs as a script from the repository root (`python experiments/X.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["replicate.py", "grad_fidelity.py", "sampler_ratio.py", "halo_sim_sweep.py",
                                    "truncated_alibi.py", "flex_cpu.py"])
def test_script_starts(script):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script finds the repository itself
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / script), "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout
