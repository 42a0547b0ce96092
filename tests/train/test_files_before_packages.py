"""Checkpoints and exports written by the code before a move still load, resume, evaluate and convert:
before ``config/`` and ``checkpoint/`` became packages, and before the biases became one object each
(``plsh_dist/biases/``).

The writer is that code itself: ``git archive`` of the commit before the move (``BEFORE``: the last with
the run config and the checkpoint files under ``plsh_dist/train/``; ``BEFORE_BIASES``: the last with the
bias table in ``models/attention.py``; ``BEFORE_WINGS``: the last with ``ops/`` one flat folder), run
from a temporary directory with its own package
first on ``PYTHONPATH``. It trains the tiny model twice, 4 steps with an export and 2 steps with a
checkpoint; this code then resumes the second to the end, evaluates the export and converts the tag.
Skipped, saying why, where the repository's history is not at hand (an installed copy, a shallow clone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.conftest import base_overrides
from tests.train.spawn import run_training

ROOT = Path(__file__).resolve().parents[2]
BEFORE = "8d57caa"
BEFORE_BIASES = "1cef320"
BEFORE_WINGS = "bc4b5aa"

WRITE = """
import json, sys
from tests.train.spawn import run_training
full, cut = json.loads(sys.argv[1])
done, stopped = run_training(1, full, cut, stop_after=[None, 2])
print(json.dumps({"full": done["losses"], "val_loss": done["val_loss"], "cut": stopped["losses"]}))
"""


def _old_code(tmp_path: Path, before: str) -> Path:
    """The package and tests as of commit ``before``, extracted into ``tmp_path / "before"``."""
    def git(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, **kw)

    try:
        known = git("cat-file", "-e", f"{before}^{{commit}}").returncode == 0
    except OSError:
        known = False
    if not known:
        pytest.skip(f"commit {before} (the code before the move) is not in this checkout's history")
    dest = tmp_path / "before"
    dest.mkdir()
    archive = git("archive", before, "plsh_dist", "tests", "launchers", check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _logits(ck, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ck.model(input_ids=tokens).logits


@pytest.mark.slow
@pytest.mark.parametrize("before, attention", [
    (BEFORE, ["--attention.bias=plsh", "--attention.num_samples=2"]),
    (BEFORE_BIASES, ["--attention.bias=plsh", "--attention.num_samples=2"]),
    (BEFORE_BIASES, ["--attention.bias=truncated", "--attention.truncate_c=1.5", "--attention.sigma=8.0"]),
    (BEFORE_WINGS, ["--attention.bias=plsh", "--attention.num_samples=2"]),
], ids=["packages-plsh", "biases-plsh", "biases-truncated", "wings-plsh"])
def test_files_written_before_the_move_load_resume_evaluate_and_convert(tiny_data, tmp_path, before, attention):
    from plsh_dist.checkpoint import convert_to_export, load_model
    from plsh_dist.train.validation import exported_validation

    old = _old_code(tmp_path, before)
    common = [*attention, "--run.max_steps=4", "--checkpoint.keep_last=0", "--memory.loss_chunk_tokens=16"]
    full = base_overrides(tiny_data, tmp_path / "full", *common, "--checkpoint.export_safetensors=true")
    cut = base_overrides(tiny_data, tmp_path / "cut", *common)
    env = dict(os.environ, PYTHONPATH=str(old), DS_ACCELERATOR="cpu", PLSH_PROGRESS="0")
    res = subprocess.run([sys.executable, "-c", WRITE, json.dumps([full, cut])], cwd=old, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    written = json.loads(res.stdout.strip().splitlines()[-1])
    assert written["cut"] == written["full"][:2]

    # Resume: this code continues the old code's checkpoint exactly as the old run went on.
    (resumed,) = run_training(1, base_overrides(tiny_data, tmp_path / "cut", *common, "--checkpoint.resume=auto"))
    assert resumed["first_step"] == 2 and resumed["losses"] == written["full"][2:]

    # Evaluate: the old export's validation loss is the one its run logged.
    ev = exported_validation(tmp_path / "full" / "final")
    assert ev["val_loss"] == pytest.approx(written["val_loss"], rel=1e-5)

    # Load and convert: the old tag, its conversion and the old export give the same logits as loaded.
    tag = tmp_path / "full" / "checkpoints" / "step_00000004"
    tokens = torch.randint(0, 512, (1, 32), generator=torch.Generator().manual_seed(0))
    from_tag = _logits(load_model(tag), tokens)
    converted = convert_to_export(tag, tmp_path / "converted")
    assert torch.equal(_logits(load_model(converted), tokens), from_tag)
    assert torch.equal(_logits(load_model(tmp_path / "full"), tokens), from_tag)
