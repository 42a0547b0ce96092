"""The learning-rate schedule an ``[optim]`` section defines: linear warmup, then cosine to ``min_lr``.

One definition, read by the trainer's scheduler (``plsh_dist.train.optim``) and by
the resume checks (``plsh_dist.checkpoint.resume_check``), which compare the
schedule a checkpoint was trained under with the one resuming it.
"""

from __future__ import annotations

import math

from plsh_dist.config.schema import OptimSection


def decay_end(optim: OptimSection, max_steps: int) -> int:
    """The step at which the cosine reaches ``min_lr``: ``[optim].decay_end``, or ``max_steps`` when 0."""
    return optim.decay_end or max_steps


def lr_at(step: int, optim: OptimSection, max_steps: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based).

    Linear warmup ``lr * (step + 1) / warmup_steps``, then cosine from ``lr`` to
    ``min_lr`` until ``decay_end(optim, max_steps)``, flat at ``min_lr`` after it.
    """
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    decay = max(1, decay_end(optim, max_steps) - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / decay)
    return optim.min_lr + 0.5 * (optim.lr - optim.min_lr) * (1.0 + math.cos(math.pi * progress))
