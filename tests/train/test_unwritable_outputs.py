"""Every directory a run writes is checked before any work: [run].out_dir, and those the data
preparation writes ([tokenizer].model_path's folder when the tokenizer is to be trained,
[data].corpus_dir, [data].cache_dir when a cache is to be built). One that cannot be written
exits 2 with one line naming the field and the fix, nothing written; one only read may be
read-only (a shared cache built elsewhere)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plsh_dist.config import load_config
from plsh_dist.data import DataConfig, TokenizerConfig, prepare_data
from plsh_dist.data.tokenizer import train_tokenizer
from tests.unwritable import read_only, unwritable_dir

ROOT = Path(__file__).resolve().parents[2]
_UNWRITABLE = "is not writable (a read-only filesystem or no permission)"


def _launch(work: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The quickstart config through the launcher, from an empty working directory."""
    return subprocess.run(
        [sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config", str(ROOT / "configs" / "quickstart.toml"),
         f"--run.out_dir={work / 'run'}", "--parallel.sp_size=1", "--local_rank=0", *overrides],
        capture_output=True, text=True, timeout=120, cwd=work,
        env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})


def _refused(proc: subprocess.CompletedProcess, head: str, tail: str, work: Path) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"config error: {head}") and tail in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert list(work.iterdir()) == []  # no out_dir, corpus, cache or tokenizer


@pytest.mark.parametrize("field", ["cache_dir", "tokenizer", "corpus_dir"])
def test_launcher_refuses_a_data_directory_it_cannot_write(tmp_path, field):
    work, ro = tmp_path / "work", tmp_path / "ro"
    work.mkdir()
    with unwritable_dir(ro):
        if field == "cache_dir":
            proc = _launch(work, f"--data.cache_dir={ro / 'cache'}")
            head = (f"[data].cache_dir = {str(ro / 'cache')!r}: the token cache of split 'train' is built there, "
                    f"but it would be created in {str(ro)!r}, not writable")
            tail = "; choose another [data].cache_dir on a writable disk"
        elif field == "tokenizer":
            proc = _launch(work, f"--tokenizer.model_path={ro / 'new.model'}")
            head = (f"[tokenizer].model_path = {str(ro / 'new.model')!r}: it does not exist, so the tokenizer is "
                    f"trained and written there, but {str(ro)!r} {_UNWRITABLE}")
            tail = "; choose another [tokenizer].model_path on a writable disk"
        else:
            proc = _launch(work, f"--data.corpus_dir={ro}")
            head = f"[data].corpus_dir = {str(ro)!r}: the embedded stdlib corpus"
            tail = f"is written there, but it {_UNWRITABLE}; choose another [data].corpus_dir on a writable disk"
    _refused(proc, head, tail, work)


def test_read_only_tokenizer_and_cache_are_read_and_a_missing_cache_is_refused(tmp_path, monkeypatch):
    """A tokenizer and token cache prepared once, then made read-only, pass the check (nothing to
    write); a setting that needs another cache (min_doc_tokens is part of its key) is refused."""
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "text" / "a.txt"
    text.parent.mkdir()
    text.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400)))
    tok_dir, cache = tmp_path / "tok", tmp_path / "cache"
    train_tokenizer([str(text)], tok_dir / "t", vocab_size=300, input_sentence_size=200)
    overrides = [f"--data.train_files=['{text}']", f"--tokenizer.model_path={tok_dir / 't.model'}",
                 "--tokenizer.vocab_size=300", f"--data.cache_dir={cache}", "--data.min_doc_tokens=1"]
    prepare_data(DataConfig(train_files=[str(text)], cache_dir=str(cache), min_doc_tokens=1),
                 TokenizerConfig(model_path=str(tok_dir / "t.model"), vocab_size=300))
    with read_only(tok_dir), read_only(cache):  # where the data preparation would write
        load_config(None, overrides)  # only read: accepted
        with pytest.raises(ValueError) as err:
            load_config(None, [*overrides, "--data.min_doc_tokens=2"])
    assert str(err.value).startswith(f"[data].cache_dir = {str(cache)!r}: the token cache of split 'train' is "
                                     f"built there, but it {_UNWRITABLE}")
