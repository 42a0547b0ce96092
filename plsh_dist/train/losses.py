"""Token loss sums: the one loss training steps and validation both compute.

Two paths, the same numbers (fp64: equal; fp32: to rounding):

- plain: the model's logits ``(B, T_local, V)``, upcast to fp32, through
  ``F.cross_entropy`` (``token_loss_sums``);
- chunked: when the model's LM head is a ``ChunkedLossHead``
  (``[deepspeed].loss_chunk_tokens`` > 0; ``plsh_dist.train.loss_head``),
  the head returns the loss sum computed over chunks of tokens, and no
  ``(B, T_local, V)`` logits are ever held (``plsh_dist.train.chunked_ce``).

``forward_sums`` picks the path from the model it is given.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plsh_dist.train.chunked_ce import IGNORE_INDEX, loss_dtype
from plsh_dist.train.loss_head import chunked_loss_head

__all__ = ["token_loss_sums", "forward_sums"]


def token_loss_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of token cross-entropies (fp32; fp64 for fp64 logits) and the number of counted tokens.

    logits (B, T_local, V); labels (B, T_local), -100 = ignored.
    """
    logits = logits.to(loss_dtype(logits.dtype))
    loss_sum = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return loss_sum, (labels != IGNORE_INDEX).sum()


def forward_sums(model, batch: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ``batch`` (a loader's dict of (B, T_local) tensors) -> ``(loss_sum, n_counted)``.

    ``model``: a causal LM or a DeepSpeed engine around one; with a
    ``ChunkedLossHead`` the loss is the chunked one (module doc).
    """
    ids, positions = batch["input_ids"].to(device), batch["position_ids"].to(device)
    labels = batch["labels"].to(device)
    head = chunked_loss_head(model)
    if head is None:
        return token_loss_sums(model(input_ids=ids, position_ids=positions).logits, labels)
    with head.loss_of(labels):
        loss_sum = model(input_ids=ids, position_ids=positions).logits  # the head's output: the loss sum
    return loss_sum, (labels != IGNORE_INDEX).sum()
