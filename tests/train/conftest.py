"""Shared pieces of the training tests: a small corpus + tokenizer, and spawned runs.

Runs are spawned with ``torch.multiprocessing`` (gloo, file rendezvous) and
call ``plsh_dist.train.train`` exactly as the launcher does; rank 0 returns
the per-step losses and gradient norms. Model: hidden 64, 2 layers; 64-token
sequences; a handful of steps, so each run takes seconds.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("PLSH_PROGRESS", "0")

import pytest  # noqa: E402

from plsh_dist.data import write_stdlib_corpus  # noqa: E402
from plsh_dist.data.tokenizer import train_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Config overrides pointing at a 30-file stdlib corpus and a 512-piece tokenizer."""
    root = tmp_path_factory.mktemp("train_data")
    corpus = write_stdlib_corpus(root / "corpus", val_fraction=0.2, max_files=30)
    train_tokenizer([str(corpus.train)], root / "tok", vocab_size=512, input_sentence_size=500)
    return [
        f"--data.train_files=['{corpus.train}']",
        f"--data.val_files=['{corpus.val}']",
        f"--data.cache_dir={root / 'cache'}",
        f"--tokenizer.model_path={root / 'tok.model'}",
        "--tokenizer.vocab_size=512",
    ]


TINY_MODEL = [
    "--model.preset=tiny", "--model.hidden_size=64", "--model.num_layers=2", "--model.num_heads=4",
    "--model.num_kv_heads=2", "--model.head_dim=16", "--model.intermediate_size=128",
]


def base_overrides(tiny_data, out_dir, *extra: str) -> list[str]:
    """A complete tiny CPU run: fp32, 64 tokens, batch 2, 4 steps, no checkpoints or export."""
    return [
        *tiny_data, *TINY_MODEL,
        f"--run.out_dir={out_dir}", "--run.device=cpu", "--run.max_steps=4", "--run.seed=3",
        "--data.seq_len=64", "--data.micro_batch_size=2", "--data.min_doc_tokens=1",
        "--optim.lr=3e-3", "--optim.warmup_steps=2", "--optim.min_lr=3e-4",
        "--logging.tensorboard=false", "--logging.progress=false", "--logging.eval_batches=2",
        "--checkpoint.export_safetensors=false", "--checkpoint.resume=never",
        *extra,
    ]
