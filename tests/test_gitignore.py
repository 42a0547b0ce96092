"""What the README's commands write stays out of git: runs, exports, caches, benchmark results."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WRITTEN = ["runs/quickstart/metrics.jsonl", "exports/q200/config.json", "data_cache/tokenizer/quickstart_bpe2k.model",
           "bench_results/attention/results.json", "gpu_results/summary.md", "build/image/rootfs/etc/hostname",
           "build/image/summary.txt"]


@pytest.mark.parametrize("path", WRITTEN)
def test_outputs_are_ignored(path):
    if subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, capture_output=True)
    assert done.returncode == 0, f"{path} is not in .gitignore"
