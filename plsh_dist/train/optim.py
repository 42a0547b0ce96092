"""AdamW with linear warmup and cosine decay, as plain torch objects."""

from __future__ import annotations

import torch
from torch import nn

from plsh_dist.config.schedule import lr_at
from plsh_dist.config.schema import OptimSection


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (ndim >= 2: linear and embedding weights), not norms or biases."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, optim: OptimSection, device_type: str) -> torch.optim.Optimizer:
    """torch AdamW, fused on CUDA and CPU (foreach elsewhere); lr is set by the scheduler.

    On CPU the fused kernel is ATen's own vectorised code (correctly rounded sqrt), where
    foreach's ``_foreach_sqrt`` calls MKL's vector math, whose last bits depend on the CPU
    model: fused keeps training bit-identical across CPUs under ``plsh_dist.cpu_paths``."""
    return torch.optim.AdamW(
        param_groups(model, optim.weight_decay),
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        fused=device_type in ("cuda", "cpu"),
    )


def build_scheduler(optimizer: torch.optim.Optimizer, optim: OptimSection, max_steps: int):
    """LambdaLR whose factor makes ``lr == lr_at(step)``; DeepSpeed steps it once
    per optimizer step and checkpoints its state."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, optim, max_steps) / optim.lr)
