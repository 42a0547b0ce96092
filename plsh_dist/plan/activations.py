"""Activation and loss memory of one micro-batch, in bytes per token.

Counted from what autograd saves in transformers' decoder layer with our
attention (checked tensor by tensor with ``saved_tensors_hooks`` in
tests/plan/test_plan_memory.py), ``b`` = bytes of the activation dtype (2 for
bf16, 4 for fp32), H hidden, Hq*D / Hkv*D the q / kv widths, I the MLP width:

- RMSNorm over ``x`` features (``n`` groups): its fp32 copy of the input
  (4x; the input itself when fp32), the fp32 rsqrt (4n) and the normalised
  input in the activation dtype (b x, saved by the weight multiply);
- decoder layer: input norm + its output (saved by the q/k/v projections),
  q/k norms on the q/k projections (Qwen3's qk-norm), the attention op's
  saved q, k, v, out (o_proj's input is ``out`` itself) and fp32 lse (4Hq),
  post-attention norm + its output, the MLP's gate, up, silu(gate) and their
  product (4 b I);
- model: input ids, position ids and labels (int64), the shared rotary cos/sin (2 b D, rope off too:
  it multiplies by 1 and 0), the final norm and its output (the LM head's input);
- with activation checkpointing a layer keeps only its input (b H) and
  rebuilds its activations in its backward, one layer at a time.

The loss, per token of the micro-batch:

- plain (full logits): forward peaks at the logits and the fp32 log-softmax
  (8V; bf16: 10V, the bf16 logits and their fp32 copy) and keeps the
  log-softmax (4V); the backward peak holds it, the NLL gradient and the
  log-softmax gradient: 12V;
- chunked (``[memory].loss_chunk_tokens`` = c): keeps the fp32 lse (4);
  its peaks are per chunk, not per token: forward 2 fp32 (c, V)
  tensors (logits and logsumexp's temporary), backward dh + the fp32 dW
  accumulator + one fp32 (c, V) tensor (bf16: + the bf16 copy of it and of
  each chunk's dW).
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
    """One layer under activation checkpointing: its input."""
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
    return ActivationBytes(layer=layer, layer_after_attention=after, attention_saved=attention,
                           checkpointed_layer=b * h, model_inputs=24 + 2 * b * shapes.head_dim,
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
