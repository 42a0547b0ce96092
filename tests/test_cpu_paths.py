"""The pinned CPU code paths are the ones torch then runs (each variable is honoured)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from plsh_dist.cpu_paths import PINNED_CPU_ENV, pinned_cpu_env

_REPORT = "import json; from plsh_dist.cpu_paths import code_paths; print(json.dumps(code_paths()))"


def _code_paths(env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", _REPORT], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="needs an AVX2 CPU")
def test_pinned_environment_sets_every_code_path():
    import os

    plain = {k: v for k, v in os.environ.items() if k not in PINNED_CPU_ENV}
    assert _code_paths(pinned_cpu_env(plain)) == {"aten_cpu_capability": "AVX2", "mkl_cbwr": "COMPATIBLE",
                                                  "threads": "1"}
    # Without the pins torch chooses by itself (MKL's reproducibility branch off): the pins change something.
    assert _code_paths(plain)["mkl_cbwr"] != "COMPATIBLE"
