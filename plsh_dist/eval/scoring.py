"""Scoring a long window: which tokens, and the metrics of their predictions.

Two ways to score a context length ``L``: ``"whole"`` (non-overlapping windows, every prediction
scored) and ``"last"`` (windows of ``L + 1`` tokens every ``K`` tokens, only the last ``K``
predictions scored, as the paper does), aligned across lengths (``align_to``) so that every length
and mode scores the same target tokens; a confidence interval over windows (:func:`mean_ci`,
:func:`paired_ci`); loss, perplexity, bits per token and top-1 accuracy. The window arithmetic and
the intervals: docs/evaluation.md, "How windows are scored".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from plsh_dist.perplexity import perplexity

#: Confidence-interval methods of :func:`mean_ci`.
CI_METHODS = ("se", "bootstrap")


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
                 max_windows: int | None = None, align_to: int | None = None) -> list[Window]:
    """Windows of a stream of ``num_tokens`` for context ``length`` (see module doc).

    ``align_to`` ("last" only): the longest length of the comparison; windows
    then end where those of every other length end (same scored tokens).
    Raises ValueError when the stream cannot fill one window of ``length + 1``
    tokens (of ``align_to + 1`` when aligned).
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
    offset, span = 0, length
    if align_to is not None and scoring == "last":
        if align_to < length:
            raise ValueError(f"align_to={align_to} must be >= the length {length} (the longest length compared)")
        if num_tokens < align_to + 1:
            raise ValueError(f"the evaluation data has {num_tokens} tokens, too few for one window of the longest "
                             f"length {align_to} (needs {align_to + 1}); use shorter --lengths or more data")
        offset, span = align_to - length, align_to
    count = (num_tokens - 1 - span) // stride + 1
    if max_windows is not None:
        count = min(count, max_windows)
    return [Window(offset + i * stride, length, score_from) for i in range(count)]


def targets_digest(tokens: np.ndarray, windows: list[Window]) -> dict:
    """Which target tokens ``windows`` score: ``{"first", "end", "count", "sha1"}``.

    ``first`` / ``end``: stream indices of the first and one past the last
    scored label; ``sha1`` of the scored labels' stream indices and ids in
    order. Two rows score the same tokens iff their digests are equal.
    """
    import hashlib

    h = hashlib.sha1()
    first, end, count = None, None, 0
    for w in windows:
        lo, hi = w.start + w.score_from + 1, w.start + w.length + 1  # labels of predictions score_from..length-1
        idx = np.arange(lo, hi, dtype=np.int64)
        h.update(idx.tobytes())
        h.update(np.asarray(tokens[lo:hi], dtype=np.int64).tobytes())
        first = lo if first is None else min(first, lo)
        end = hi if end is None else max(end, hi)
        count += hi - lo
    return {"first": first, "end": end, "count": count, "sha1": h.hexdigest()}


def t_quantile(p: float, df: int) -> float:
    """Quantile ``p`` (> 0.5) of Student's t with ``df`` degrees of freedom.

    Exact for df = 1 and 2; otherwise the Cornish-Fisher expansion around the
    normal quantile (Abramowitz & Stegun 26.7.5): at p = 0.975 within 0.13%
    of the exact value at df = 3, 0.01% at df = 5, 1e-6 from df = 30.
    """
    from statistics import NormalDist

    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


def mean_ci(values, level: float = 0.95, method: str = "se", resamples: int = 2000, seed: int = 0) -> dict:
    """Mean of ``values`` (one per window) with a ``level`` confidence interval.

    ``"se"``: mean ± t_{n-1} x standard error (sample std / sqrt(n));
    ``"bootstrap"``: percentile interval of ``resamples`` means of windows
    drawn with replacement (numpy generator seeded with ``seed``: reproducible).
    Returns ``{"mean", "se", "low", "high", "n", "method", "level"}``; with one
    value the interval is undefined (NaN).
    """
    if method not in CI_METHODS:
        raise ValueError(f"ci method must be one of {CI_METHODS}, got {method!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"ci level must be in (0, 1), got {level}")
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(x.mean())
    out = {"mean": mean, "se": math.nan, "low": math.nan, "high": math.nan, "n": int(x.size), "method": method,
           "level": level}
    if x.size < 2:
        return out
    se = float(x.std(ddof=1) / math.sqrt(x.size))
    out["se"] = se
    if method == "se":
        q = t_quantile(0.5 + level / 2, x.size - 1)
        out["low"], out["high"] = mean - q * se, mean + q * se
    else:
        if resamples < 100:
            raise ValueError(f"bootstrap needs resamples >= 100, got {resamples}")
        rng = np.random.default_rng(seed)
        means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
        lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
        out["low"], out["high"] = float(lo), float(hi)
    return out


def paired_ci(a, b, **kwargs) -> dict:
    """:func:`mean_ci` of the per-window differences ``a - b`` (same windows, same order)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired_ci needs the same windows on both sides, got {a.shape} and {b.shape}")
    return mean_ci(a - b, **kwargs)


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
