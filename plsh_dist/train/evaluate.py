"""Validation perplexity of exported weights, in one process (no DeepSpeed).

The evaluation package supplies the full tool (perplexity vs context length,
per attention mode); this is the check the quickstart and tests run on the
final export.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from plsh_dist.train.export import load_exported
from plsh_dist.train.loop import validation_loss

__all__ = ["evaluate_exported"]


def evaluate_exported(directory: str | Path, *, eval_batches: int | None = None, attn_cfg=None) -> dict:
    """Validation loss and perplexity of ``directory`` (an ``export_final`` output).

    Uses the run's own data config (cached token streams) and the first
    ``eval_batches`` validation batches (default: the run's [logging].eval_batches),
    the same batches and hash seeds the training loop's final validation used.
    """
    from plsh_dist.data import build_loader, prepare_data
    from plsh_dist.models import get_runtime

    model, cfg = load_exported(directory, attn_cfg=attn_cfg)
    prepared = prepare_data(cfg.data, cfg.tokenizer)
    stream = prepared.val if prepared.val is not None else prepared.train
    loader = build_loader(stream, cfg.data, train=False)
    n = cfg.logging.eval_batches if eval_batches is None else eval_batches
    batches = (b for i, b in zip(range(n), loader))
    loss = validation_loss(model, batches, get_runtime(model), torch.device("cpu"))
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)), "batches": n,
            "tokens": n * cfg.data.micro_batch_size * cfg.data.seq_len}
