"""Scoring a long window: which tokens, and the metrics of their predictions.

Two ways to score a context length ``L`` (legend: N tokens in the stream,
L context length, K scored tokens per window):

- ``"whole"``: non-overlapping windows ``tokens[i*L : i*L + L + 1]``; every
  one of the ``L`` predictions of a window is scored (early tokens see short
  contexts, so this mixes all context lengths up to L);
- ``"last"``: windows of ``L + 1`` tokens starting every ``K`` tokens
  (overlapping when ``K < L``); only the **last K predictions** of each
  window are scored, each with at least ``L - K`` tokens of context. The
  paper scores the last 8192 tokens of longer windows this way. Consecutive
  windows' scored spans tile the stream without overlap.

Metrics of a set of scored tokens: mean cross-entropy (nats) ``loss``,
``perplexity = exp(loss)`` (``plsh_dist.perplexity``), ``bits_per_token =
loss / ln 2`` and next-token top-1 ``accuracy``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from plsh_dist.perplexity import perplexity

__all__ = ["Window", "plan_windows", "TokenSums", "metrics_of", "score_hidden", "window_tokens"]


@dataclass(frozen=True)
class Window:
    """One evaluation window: ``tokens[start : start + length + 1]``; predictions
    ``score_from .. length - 1`` (window-relative) are scored."""

    start: int
    length: int
    score_from: int

    @property
    def scored(self) -> int:
        return self.length - self.score_from


def plan_windows(num_tokens: int, length: int, scoring: str, last_tokens: int | None = None,
                 max_windows: int | None = None) -> list[Window]:
    """Windows of a stream of ``num_tokens`` for context ``length`` (see module doc).

    Raises ValueError when the stream cannot fill one window of ``length + 1`` tokens.
    """
    if length < 1:
        raise ValueError(f"context length must be >= 1, got {length}")
    if num_tokens < length + 1:
        raise ValueError(f"the evaluation data has {num_tokens} tokens, too few for one window of length "
                         f"{length} (needs {length + 1}); use shorter --lengths or more data")
    if scoring == "whole":
        stride, score_from = length, 0
    elif scoring == "last":
        if last_tokens is None or not 1 <= last_tokens <= length:
            raise ValueError(f"scoring 'last' needs 1 <= last_tokens <= length={length}, got {last_tokens}")
        stride, score_from = last_tokens, length - last_tokens
    else:
        raise ValueError(f"scoring must be 'whole' or 'last', got {scoring!r}")
    count = (num_tokens - 1 - length) // stride + 1
    if max_windows is not None:
        count = min(count, max_windows)
    return [Window(i * stride, length, score_from) for i in range(count)]


@dataclass
class TokenSums:
    """Additive statistics of scored tokens (sum over windows, ranks, ...)."""

    loss_sum: float = 0.0
    """Sum of token cross-entropies, nats (float64)."""
    correct: int = 0
    """Tokens whose argmax prediction is the label."""
    count: int = 0
    """Scored tokens."""

    def add(self, other: "TokenSums") -> None:
        self.loss_sum += other.loss_sum
        self.correct += other.correct
        self.count += other.count

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([self.loss_sum, float(self.correct), float(self.count)], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "TokenSums":
        return cls(float(t[0]), int(round(float(t[1]))), int(round(float(t[2]))))


def metrics_of(sums: TokenSums) -> dict[str, float]:
    """loss (nats/token), perplexity, bits per token, top-1 accuracy, tokens."""
    if sums.count == 0:
        raise ValueError("no scored tokens: nothing to average")
    loss = sums.loss_sum / sums.count
    return {
        "loss": loss,
        "perplexity": perplexity(loss),
        "bits_per_token": loss / math.log(2.0),
        "accuracy": sums.correct / sums.count,
        "tokens": sums.count,
    }


def score_hidden(hidden: torch.Tensor, lm_head: torch.nn.Module, labels: torch.Tensor, keep: torch.Tensor,
                 chunk: int = 1024) -> TokenSums:
    """Sums of the predictions at positions ``keep`` (bool).

    hidden (T, H) final hidden states; labels (T,) next-token ids; keep (T,).
    The LM head runs on ``chunk`` positions at a time, so a long window never
    holds a (T, vocab) logits matrix (151k vocab x 32k tokens = 19 GB in fp32).
    """
    idx = torch.nonzero(keep, as_tuple=False).flatten()
    sums = TokenSums()
    for lo in range(0, idx.numel(), chunk):
        sel = idx[lo : lo + chunk]
        logits = lm_head(hidden[sel]).float()  # (c, V)
        y = labels[sel]
        sums.loss_sum += float(F.cross_entropy(logits, y, reduction="sum").double())
        sums.correct += int((logits.argmax(-1) == y).sum())
        sums.count += int(sel.numel())
    return sums


def window_tokens(tokens: np.ndarray, w: Window) -> torch.Tensor:
    """int64 (length + 1,) tokens of window ``w``."""
    return torch.from_numpy(np.asarray(tokens[w.start : w.start + w.length + 1], dtype=np.int64))
