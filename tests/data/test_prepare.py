"""End to end: config -> stdlib corpus -> tokenizer -> caches -> batches; launchers' CLIs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plsh_dist.data import DataConfig, TokenizerConfig, build_loader, prepare_data
from plsh_dist.data.tokenizer import EOS_ID

REPO = Path(__file__).resolve().parents[2]


def test_quickstart_path_is_cached(tmp_path, monkeypatch):
    cfg = DataConfig(seq_len=64, micro_batch_size=2, cache_dir=str(tmp_path / "cache"),
                     corpus_dir=str(tmp_path / "corpus"), corpus_max_files=25, corpus_val_fraction=0.2)
    tok_cfg = TokenizerConfig(model_path=str(tmp_path / "tok" / "t.model"), vocab_size=400, input_sentence_size=1000)
    data = prepare_data(cfg, tok_cfg)
    assert Path(tok_cfg.model_path).is_file() and data.val is not None
    assert data.reports["train"].kept == data.train.num_docs > 0
    assert "corpus" in data.reports

    # Second run: no training, no tokenising (both would fail if attempted).
    import plsh_dist.data.token_cache as cache_mod
    import plsh_dist.data.tokenizer as tokenizer_mod

    monkeypatch.setattr(tokenizer_mod, "train_tokenizer", lambda *a, **k: pytest.fail("tokenizer retrained"))
    monkeypatch.setattr(cache_mod, "build_token_stream", lambda *a, **k: pytest.fail("re-tokenised"))
    again = prepare_data(cfg, tok_cfg)
    assert again.train.path == data.train.path and again.train.num_tokens == data.train.num_tokens
    assert again.reports["train"].counts == data.reports["train"].counts

    plain = next(iter(build_loader(again.train, cfg, dp_rank=1, dp_size=2, sp_rank=0, sp_size=2)))
    assert set(plain) == {"input_ids", "labels", "position_ids"}  # document_masking: off by default
    masked_cfg = dataclasses.replace(cfg, document_masking=True)
    loader = build_loader(again.train, masked_cfg, dp_rank=1, dp_size=2, sp_rank=0, sp_size=2)
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "labels", "position_ids", "cu_seqlens"}
    cu = batch.pop("cu_seqlens")
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == 2 * 64  # the whole (B, T) batch, not the SP chunk
    assert all(v.shape == (2, 32) and v.dtype == torch.long for v in batch.values())
    assert int(batch["input_ids"].max()) < again.tokenizer.vocab_size
    val = build_loader(again.val, cfg, train=False, seq_len=32)
    n = sum(b["input_ids"].shape[0] for b in val)
    assert n == (again.val.num_tokens - 1) // 32
    assert int((again.train.tokens == EOS_ID).sum()) == again.train.num_docs


def test_config_checks():
    with pytest.raises(ValueError, match="DataConfig.seq_len"):
        DataConfig(seq_len=0)
    with pytest.raises(ValueError, match="DataConfig.sample_by"):
        DataConfig(sample_by="sentence")
    with pytest.raises(ValueError, match="val_files"):
        DataConfig(val_files=["v.jsonl"])
    with pytest.raises(ValueError, match="TokenizerConfig.model_path"):
        TokenizerConfig(model_path="tok.bin")
    assert DataConfig(train_files="a.txt").train_files == ["a.txt"]


@pytest.mark.parametrize("script", ["train_tokenizer.py", "prepare_corpus.py"])
def test_launcher_help(script):
    out = subprocess.run([sys.executable, str(REPO / "launchers" / script), "--help"], capture_output=True,
                         text=True, cwd="/", timeout=120)
    assert out.returncode == 0 and "usage" in out.stdout


def test_launchers_end_to_end(tmp_path):
    run = lambda *args: subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,  # noqa: E731
                                       cwd=tmp_path, timeout=300)
    corpus = run(REPO / "launchers" / "prepare_corpus.py", "--out", tmp_path / "c", "--max-files", "10")
    assert corpus.returncode == 0, corpus.stderr
    tok = run(REPO / "launchers" / "train_tokenizer.py", "--input", tmp_path / "c" / "train.jsonl",
              "--vocab-size", "350", "--out", tmp_path / "t" / "tok", "--input-sentence-size", "500")
    assert tok.returncode == 0, tok.stderr
    assert (tmp_path / "t" / "tok.model").is_file()
