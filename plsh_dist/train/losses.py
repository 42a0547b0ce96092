"""Token loss sums: the one loss training steps and validation both compute."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["token_loss_sums", "forward_sums"]


def token_loss_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of token cross-entropies (fp32) and the number of counted tokens.

    logits (B, T_local, V); labels (B, T_local), -100 = ignored.
    """
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    return loss_sum, (labels != -100).sum()


def forward_sums(model, batch: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ``batch`` (a loader's dict of (B, T_local) tensors) -> ``token_loss_sums``."""
    out = model(input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device))
    return token_loss_sums(out.logits, batch["labels"].to(device))
