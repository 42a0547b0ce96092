"""The LM head that returns the chunked token-loss sum instead of logits, when asked.

``install_chunked_loss(model, chunk_tokens)`` replaces a transformers causal
LM's ``lm_head`` (an ``nn.Linear``) with a ``ChunkedLossHead`` holding the
*same* weight (and bias) Parameter: the state_dict, the tying to the
embedding, checkpoints and exports are unchanged. Called with hidden states
alone it computes logits exactly as the Linear did (evaluation, generation).
Inside ``with head.loss_of(labels):`` its forward returns the 0-d token-loss
sum of ``plsh_dist.train.chunked_ce`` (the model's output then carries that
sum in its ``logits`` field), so no ``(B, T_local, V)`` logits exist.

Why the loss is computed inside the head's forward, and not from the model's
hidden states outside it: the training step calls the DeepSpeed engine,
whose forward registers the backward prologue of its ZeRO optimizer on the
*outputs* of the wrapped module (a loss computed from a bypassing call would
never run it), and ZeRO-3 gathers a parameter only inside the forward and
backward of the module that owns it (the LM head's weight is partitioned
everywhere else). Computed in the head, the loss flows through the engine's
forward like the logits did, under every ZeRO stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from plsh_dist.train.chunked_ce import chunked_cross_entropy_sums


class ChunkedLossHead(nn.Module):
    """Drop-in for ``lm_head``: logits by default, the chunked loss sum under ``loss_of``.

    ``weight`` (V, D) and ``bias`` (V,) or None are the replaced Linear's own Parameters.
    """

    def __init__(self, linear: nn.Linear, chunk_tokens: int):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"the LM head must be an nn.Linear to compute a chunked loss, got {type(linear).__name__}")
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be an int >= 1, got {chunk_tokens!r}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.chunk_tokens = chunk_tokens
        self._labels: torch.Tensor | None = None

    @contextlib.contextmanager
    def loss_of(self, labels: torch.Tensor) -> Iterator[None]:
        """While open, ``forward(hidden (B, T, D))`` returns the 0-d sum of token
        cross-entropies against ``labels`` (B, T) (-100 = ignored)."""
        self._labels = labels
        try:
            yield
        finally:
            self._labels = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._labels is None:
            return F.linear(hidden, self.weight, self.bias)
        if self._labels.shape != hidden.shape[:-1]:
            raise ValueError(f"labels {tuple(self._labels.shape)} do not match the hidden states "
                             f"{tuple(hidden.shape)} the LM head received (expected {tuple(hidden.shape[:-1])})")
        loss_sum, _ = chunked_cross_entropy_sums(hidden, self.weight, self._labels, bias=self.bias,
                                                 chunk_tokens=self.chunk_tokens)
        return loss_sum

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, chunk_tokens={self.chunk_tokens}")


def install_chunked_loss(model: nn.Module, chunk_tokens: int) -> ChunkedLossHead:
    """Replace ``model``'s LM head (``get_output_embeddings()``) by a ``ChunkedLossHead``
    on the same Parameters; returns it. Call before DeepSpeed wraps the model."""
    head = model.get_output_embeddings()
    if isinstance(head, ChunkedLossHead):
        raise ValueError("the model's LM head is already a ChunkedLossHead")
    new = ChunkedLossHead(head, chunk_tokens)
    model.set_output_embeddings(new)
    return new


def chunked_loss_head(model: nn.Module) -> ChunkedLossHead | None:
    """The ``ChunkedLossHead`` of ``model`` (a causal LM or a DeepSpeed engine around one), or None."""
    inner = getattr(model, "module", model)
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if get is not None else None
    return head if isinstance(head, ChunkedLossHead) else None
