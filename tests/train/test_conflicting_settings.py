"""Settings that contradict each other are refused in one line naming both, before any work
(they were accepted, one silently ignored): a warmup longer than the run, ``--resume`` against
``--checkpoint.resume``, a [tokenizer].vocab_size another than the tokenizer file's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plsh_dist.config import load_config
from plsh_dist.config.schedule import lr_at
from plsh_dist.data.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_empty_dir(tmp_path, monkeypatch):
    """Relative default paths (tokenizer model, caches) must not hit files of the checkout."""
    monkeypatch.chdir(tmp_path)


def _launch(work: Path, *args: str) -> subprocess.CompletedProcess:
    """configs/debug.toml through the launcher from ``work``, which holds nothing."""
    return subprocess.run(
        [sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config", str(ROOT / "configs" / "debug.toml"),
         f"--run.out_dir={work / 'run'}", "--local_rank=0", *args],
        capture_output=True, text=True, timeout=120, cwd=work,
        env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})


def _refused(proc: subprocess.CompletedProcess, expected: str, work: Path) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == f"config error: {expected}\n", proc.stderr[-3000:]
    assert list(work.iterdir()) == []  # no out_dir, corpus, cache or tokenizer


def test_a_warmup_longer_than_the_run_is_refused_through_the_launcher(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    proc = _launch(work, "--optim.warmup_steps=100", "--run.max_steps=3")
    _refused(proc, "[optim].warmup_steps = 100 is more than [run].max_steps = 3: the run would end inside its warmup, "
                   "its rate never reaching [optim].lr = 0.003 (at most 9e-05); set --optim.warmup_steps=3 or less, "
                   "or, to train the first 3 steps of a longer schedule, set [optim].decay_end to that schedule's "
                   "last step", work)


def test_a_warmup_longer_than_the_run_is_accepted_as_the_start_of_a_longer_schedule():
    """decay_end names the longer schedule the run begins: its rates are that schedule's first ones."""
    cfg = load_config(None, ["--optim.warmup_steps=100", "--run.max_steps=3", "--optim.decay_end=1000"])
    assert [lr_at(s, cfg.optim, 3) for s in range(3)] == [cfg.optim.lr * (s + 1) / 100 for s in range(3)]
    load_config(None, ["--optim.warmup_steps=3", "--run.max_steps=3"])  # reaches the rate at its last step


def test_a_warmup_past_the_decay_end_is_refused():
    with pytest.raises(ValueError) as err:
        load_config(None, ["--optim.warmup_steps=100", "--run.max_steps=300", "--optim.decay_end=50"])
    assert str(err.value) == ("[optim].warmup_steps = 100 is more than [optim].decay_end = 50: the decay to min_lr would "
                              "end before the warmup reaches [optim].lr; set warmup_steps <= 50, or decay_end >= 100")


def test_resume_flag_and_resume_override_that_disagree_are_refused(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    proc = _launch(work, "--resume", "never", "--checkpoint.resume=auto")
    _refused(proc, "--resume never and --checkpoint.resume=auto disagree (--resume sets [checkpoint].resume); give "
                   "only one of them", work)


def test_resume_flag_and_resume_override_that_agree_are_accepted(tmp_path):
    """The same value twice is no conflict; the run then fails on something else, here the layout (sp_size 4
    on one process), which proves the resume flags passed."""
    work = tmp_path / "work"
    work.mkdir()
    proc = _launch(work, "--resume", "auto", "--checkpoint.resume", "auto", "--parallel.sp_size=4")
    assert proc.returncode == 2 and proc.stderr.startswith("config error: [parallel].sp_size=4 does not divide"), \
        proc.stderr[-3000:]


def test_a_tokenizer_vocab_size_other_than_the_files_is_refused(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400)))
    tok = train_tokenizer([str(text)], tmp_path / "t", vocab_size=300, input_sentence_size=200)
    path = tmp_path / "t.model"
    with pytest.raises(ValueError) as err:
        load_config(None, [f"--tokenizer.model_path={path}", "--tokenizer.vocab_size=4096"])
    assert str(err.value) == (
        f"[tokenizer].vocab_size = 4096, but the tokenizer file [tokenizer].model_path = {str(path)!r} has "
        f"{tok.vocab_size} pieces, and an existing file is used as it is (vocab_size sizes only a tokenizer still "
        f"to be trained); set [tokenizer].vocab_size = {tok.vocab_size} (or leave it out) to use this file, or set "
        "model_path to a file that does not exist yet to train a 4096-piece tokenizer there")
    # Left out, or equal to the file's: the file is used.
    assert load_config(None, [f"--tokenizer.model_path={path}"]).model.vocab_size == tok.vocab_size
    load_config(None, [f"--tokenizer.model_path={path}", f"--tokenizer.vocab_size={tok.vocab_size}"])
