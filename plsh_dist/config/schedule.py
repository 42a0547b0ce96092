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


def check_schedule(optim: OptimSection, max_steps: int) -> None:
    """ValueError naming the fields when the schedule never reaches ``[optim].lr``: the warmup
    outlasts the run (``warmup_steps > max_steps``, decay_end unset) or the decay
    (``warmup_steps > decay_end``). A run shorter than its warmup is meaningful only as the first
    steps of a longer schedule, which ``decay_end`` names: with it set past ``max_steps`` the
    run is accepted (a resume with a larger ``max_steps`` continues it)."""
    warmup, lr = optim.warmup_steps, optim.lr
    if optim.decay_end and warmup > optim.decay_end:
        raise ValueError(
            f"[optim].warmup_steps = {warmup} is more than [optim].decay_end = {optim.decay_end}: the decay to "
            f"min_lr would end before the warmup reaches [optim].lr; set warmup_steps <= {optim.decay_end}, or "
            f"decay_end >= {warmup}")
    if not optim.decay_end and warmup > max_steps:
        raise ValueError(
            f"[optim].warmup_steps = {warmup} is more than [run].max_steps = {max_steps}: the run would end inside "
            f"its warmup, its rate never reaching [optim].lr = {lr:g} (at most {lr_at(max_steps - 1, optim, max_steps):.3g}); "
            f"set --optim.warmup_steps={max_steps} or less, or, to train the first {max_steps} steps of a longer "
            f"schedule, set [optim].decay_end to that schedule's last step")
