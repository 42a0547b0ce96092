"""Token loss sums: the one loss training steps and validation both compute.

Two paths, the same numbers (fp64: equal; fp32: to rounding):

- plain: the model's logits ``(B, T_local, V)``, upcast to fp32, through
  ``F.cross_entropy`` (``token_loss_sums``);
- chunked: when the model's LM head is a ``ChunkedLossHead``
  (``[memory].loss_chunk_tokens`` > 0; ``plsh_dist.train.loss_head``),
  the head returns the loss sum computed over chunks of tokens, and no
  ``(B, T_local, V)`` logits are ever held (``plsh_dist.train.chunked_ce``).

``forward_sums`` picks the path from the model it is given. A batch with
``cu_seqlens`` (``[data].document_masking``) reaches the model as
transformers' packed-sequence keywords (``packed_kwargs``), so attention stays
inside each document; without it the model call is exactly the plain one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plsh_dist.data.packing import max_document_length
from plsh_dist.train.chunked_ce import IGNORE_INDEX, loss_dtype
from plsh_dist.train.loss_head import chunked_loss_head


def token_loss_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of token cross-entropies (fp32; fp64 for fp64 logits) and the number of counted tokens.

    logits (B, T_local, V); labels (B, T_local), -100 = ignored.
    """
    logits = logits.to(loss_dtype(logits.dtype))
    loss_sum = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return loss_sum, (labels != IGNORE_INDEX).sum()


def packed_kwargs(batch: dict[str, torch.Tensor]) -> dict:
    """The model's document-layout keywords for ``batch``: ``{}`` without ``cu_seqlens``, else
    ``cu_seq_lens_q/k`` (the int32 offsets) and ``max_length_q/k`` (the longest document, int).

    The offsets stay on the host: plsh_dist's attention plans its blocks there, so a
    device copy would only cost a copy and a sync back (once per forward)."""
    cu = batch.get("cu_seqlens")
    if cu is None:
        return {}
    cu = cu.to(dtype=torch.int32)
    longest = max_document_length(cu)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def forward_sums(model, batch: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ``batch`` (a loader's dict of (B, T_local) tensors) -> ``(loss_sum, n_counted)``.

    ``model``: a causal LM or a DeepSpeed engine around one; with a
    ``ChunkedLossHead`` the loss is the chunked one (module doc). With
    ``batch["cu_seqlens"]`` the model also gets ``packed_kwargs``.
    """
    ids, positions = batch["input_ids"].to(device), batch["position_ids"].to(device)
    labels = batch["labels"].to(device)
    packed = packed_kwargs(batch)
    head = chunked_loss_head(model)
    if head is None:
        return token_loss_sums(model(input_ids=ids, position_ids=positions, **packed).logits, labels)
    with head.loss_of(labels):
        loss_sum = model(input_ids=ids, position_ids=positions, **packed).logits  # the head's output: the loss sum
    return loss_sum, (labels != IGNORE_INDEX).sum()
