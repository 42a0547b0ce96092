"""launchers/prepare_data.py: tokenizes a corpus before the launch on several threads, resumes when
interrupted, gives the tokens of a 1-thread build, and training with the same config only opens
the cache (it prints the command that does so). The interrupted build is ``make test-slow``'s."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time

import pytest

from plsh_dist.data.sources import iter_documents
from plsh_dist.data.token_cache import PARTIAL_DIR, build_token_stream
from plsh_dist.data.tokenizer import Tokenizer
from tests.train.conftest import TINY_MODEL
from tests.train.launcher_runs import ROOT, launcher_env

PREPARE = ROOT / "launchers" / "prepare_data.py"


def _corpus(corpus_texts, path, mb: float = 13.0) -> None:
    """A jsonl of the small corpus's documents, repeated (each copy named) to about ``mb`` MB: 4 chunks."""
    with open(path, "w", encoding="utf-8") as f:
        size, copy = 0, 0
        while size < mb * 1e6:
            for i, text in enumerate(corpus_texts):
                line = json.dumps({"text": f"# copy {copy}\n{text}"}) + "\n"
                f.write(line)
                size += len(line)
            copy += 1


@pytest.mark.slow  # a 13 MB corpus, killed and resumed through the launcher (in-process: test_token_cache_resume.py)
def test_prepare_data_resumes_and_training_only_opens_its_cache(corpus_texts, tmp_path):
    corpus, cache = tmp_path / "corpus.jsonl", tmp_path / "cache"
    _corpus(corpus_texts, corpus)
    config = tmp_path / "run.toml"
    config.write_text(f'[data]\ntrain_files = ["{corpus}"]\ncache_dir = "{cache}"\n'
                      f'[tokenizer]\nmodel_path = "{tmp_path / "tok.model"}"\nvocab_size = 512\n'
                      'input_sentence_size = 500\n')
    overrides = [*TINY_MODEL, f"--run.out_dir={tmp_path / 'out'}", "--run.device=cpu", "--run.max_steps=2",
                 "--data.seq_len=64", "--data.micro_batch_size=2", "--optim.warmup_steps=1",
                 "--logging.tensorboard=false", "--checkpoint.export_safetensors=false"]
    cmd = [sys.executable, str(PREPARE), "--config", str(config), "--threads", "2", *overrides]

    # Slowed, interrupted (Ctrl-C) once a chunk is done: the tokenizer is trained, some chunks are tokenized.
    first = subprocess.Popen(cmd, cwd=ROOT, env=launcher_env(PLSH_SLOW_TOKENIZE_S="2"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(cache.rglob(f"{PARTIAL_DIR}/chunk_*.json")) and time.time() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 130, err[-2000:]
    assert "run the same command again to resume" in err
    assert not list(cache.rglob("meta.json")) and not (cache / "prepare.lock").exists()
    assert (tmp_path / "tok.model").is_file()  # trained first, as training would

    done = subprocess.run(cmd, cwd=ROOT, env=launcher_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed the interrupted build" in done.stderr and "chunks were tokenized already" in done.stderr
    assert "MB/s" in done.stderr and "ETA" in done.stderr  # the progress lines (stderr is no terminal here)
    [meta] = cache.rglob("meta.json")
    assert not (meta.parent / PARTIAL_DIR).exists()

    # Bit for bit the tokens of a fresh build on one thread, in the same document order.
    reference = build_token_stream(iter_documents([str(corpus)], with_location=True),
                                   Tokenizer.load(tmp_path / "tok.model"), tmp_path / "reference", "k", 32, threads=1)
    assert (meta.parent / "tokens.bin").read_bytes() == (tmp_path / "reference" / "tokens.bin").read_bytes()
    assert json.loads(meta.read_text())["num_docs"] == reference.num_docs

    # The printed command trains on the cache and never tokenizes.
    printed = done.stdout.strip().splitlines()[-1].split()
    assert printed[:2] == ["DS_ACCELERATOR=cpu", "python"]
    train = subprocess.run([sys.executable, *printed[2:]], cwd=ROOT, env=launcher_env(), capture_output=True,
                           text=True, timeout=300)
    assert train.returncode == 0, train.stderr[-3000:]
    assert f"token cache hit {meta.parent}" in train.stderr
    assert "building token cache" not in train.stderr and "tokenizing train" not in train.stderr
    assert shlex.join(overrides) in done.stdout  # the overrides travel with the printed command


def test_bad_threads_are_refused_before_any_work(tmp_path):
    done = subprocess.run([sys.executable, str(PREPARE), "--config", str(tmp_path / "none.toml"), "--threads", "0"],
                          cwd=ROOT, env=launcher_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["config error: --threads must be >= 1, got 0; leave it out to use "
                                                "every core"]
