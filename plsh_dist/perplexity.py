"""Perplexity of a mean token loss: the one definition training and evaluation report."""

from __future__ import annotations

import math

_MAX_LOSS = 700.0


def perplexity(loss: float) -> float:
    """``exp(loss)`` of a mean cross-entropy in nats, the loss clamped at 700:
    ``math.exp`` overflows float64 (OverflowError) past ~709.78 nats, so a
    diverged run reports a huge but finite perplexity instead of crashing."""
    return math.exp(min(loss, _MAX_LOSS))
