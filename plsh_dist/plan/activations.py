"""Activation and loss memory of one micro-batch, in bytes per token.

Counted from what autograd saves in transformers' decoder layer with our attention (checked tensor
by tensor with ``saved_tensors_hooks`` in tests/plan/test_plan_memory.py): the norms, the attention
op's q, k, v, out and lse, the MLP, the model's inputs and rotary tables, a checkpointed layer's
input alone (full) or with its matmuls' and attention's outputs (selective); and the loss, plain (full logits) or chunked (``[memory].loss_chunk_tokens``). The
tensor by tensor account: docs/memory.md, "What autograd saves per token".
"""

from __future__ import annotations

from dataclasses import dataclass

from plsh_dist.plan.shapes import ModelShapes


def _norm(features: int, groups: int, b: int) -> int:
    """Saved bytes per token of one RMSNorm (its output excluded)."""
    return 4 * features + 4 * groups + b * features


@dataclass(frozen=True)
class ActivationBytes:
    """Saved activation bytes per token (of one rank's micro-batch)."""

    layer: int
    """One decoder layer, everything it saves for backward."""
    layer_after_attention: int
    """The part of ``layer`` saved after the attention op (post norm + MLP): freed
    before the attention's backward runs."""
    attention_saved: int
    """The attention op's own saves (q, k, v, out, lse), part of ``layer``."""
    checkpointed_layer: int
    """One layer under full activation checkpointing: its input."""
    selective_layer: int
    """One layer under selective activation checkpointing: its input, its seven matmuls' outputs
    (q, k, v, o, gate, up, down: eagerly every one is kept; compiled, the partitioner drops down's,
    which backward does not need) and the attention op's out and lse."""
    model_inputs: int
    """Outside the layers: input ids, position ids and labels (int64), the shared rotary cos/sin."""
    final_norm: int
    """The final norm and its output (the LM head's input); freed by the head's backward."""

    @property
    def model(self) -> int:
        return self.model_inputs + self.final_norm


def activation_bytes(shapes: ModelShapes, b: int) -> ActivationBytes:
    """Per-token activation bytes of ``shapes`` in an activation dtype of ``b`` bytes."""
    h, q, kv, i = shapes.hidden, shapes.q_dim, shapes.kv_dim, shapes.intermediate
    attention = b * (2 * q + 2 * kv) + 4 * shapes.q_heads
    qk_norms = _norm(q, shapes.q_heads, b) + _norm(kv, shapes.kv_heads, b) if shapes.qk_norm else 0
    after = _norm(h, 1, b) + b * h + 4 * b * i
    layer = _norm(h, 1, b) + b * h + qk_norms + attention + after
    selective = b * (3 * h + 2 * q + 2 * kv + 2 * i) + 4 * shapes.q_heads
    return ActivationBytes(layer=layer, layer_after_attention=after, attention_saved=attention,
                           checkpointed_layer=b * h, selective_layer=selective,
                           model_inputs=24 + 2 * b * shapes.head_dim,
                           final_norm=_norm(h, 1, b) + b * h)


def loss_saved_bytes_per_token(vocab: int, chunk_tokens: int) -> int:
    """Bytes per token the loss keeps from its forward to its backward: the fp32 lse
    (chunked) or the fp32 log-softmax (plain)."""
    return 4 if chunk_tokens else 4 * vocab


@dataclass(frozen=True)
class LossPeak:
    """Peak bytes of the loss for one micro-batch, its saved part included."""

    forward: int
    backward: int


def loss_peak_bytes(n: int, vocab: int, hidden: int, b: int, chunk_tokens: int) -> LossPeak:
    """Forward and backward peaks of the loss for ``n`` tokens (module doc).

    ``b``: bytes of the hidden states and LM head (2 bf16, 4 fp32); ``chunk_tokens`` 0 = plain.
    """
    if not chunk_tokens:
        forward = (10 if b < 4 else 8) * vocab * n  # (bf16 logits +) fp32 logits + log-softmax
        return LossPeak(forward=forward, backward=12 * vocab * n)
    c = min(chunk_tokens, n)
    saved = n * loss_saved_bytes_per_token(vocab, chunk_tokens)
    backward = n * hidden * b + 4 * vocab * hidden + 4 * c * vocab
    if b < 4:  # the bf16 copy of the chunk's gradient, and of each chunk's dW before its fp32 add
        backward += b * c * vocab + (b + 4) * vocab * hidden
    return LossPeak(forward=saved + 8 * c * vocab, backward=saved + backward)
