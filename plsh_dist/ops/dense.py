"""Dense softmax attention math that returns / accepts the log-sum-exp.

The building block of every strategy: softmax attention on a batch of short
sequences (blocks, or query chunks against a key range), forward returning
``(out, lse)`` and backward taking a possibly *merged* ``(out, lse)`` — the
recipe ring attention uses, which lets several partial attentions share one
backward without storing anything per part.

Layout legend (this file only): N batch of sequences, H heads, Lq / Lk
query / key length, D head dim; tensors are (N, H, L, D), lse is (N, H, Lq).

Two kernels with one signature (:class:`DenseKernel`):

- ``ATEN``: PyTorch's flash-attention-for-CPU kernels
  (``_scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``),
  a faithful stand-in for flash-attn's forward/backward on CPU;
- ``MATH``: explicit matmuls, for any device and dtype (CUDA without
  flash-attn). Memory O(N * H * Lq * Lk): only for short blocks or chunks.

``AUTO`` (or None) picks one per call with :func:`kernel_for`, by the call's
key length: a size rule inside the chosen strategy, not a choice of strategy
(that is :func:`plsh_dist.ops.backends.choose_strategy`'s alone).
"""

from __future__ import annotations

import enum
import functools

import torch

from plsh_dist.ops.merge import accum_dtype


class DenseKernel(str, enum.Enum):
    """What computes one dense attention call (padded blocks, or query chunks against a key range)."""

    AUTO = "auto"
    """aten's flash-attention-for-CPU, or ``MATH`` for at most :data:`MATH_MAX_LEN`
    keys or off the CPU (chosen per call by :func:`kernel_for`)."""
    MATH = "math"
    """Explicit matmuls (any device/dtype; memory O(queries x keys) per call)."""
    ATEN = "aten"
    """``_scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``."""

_ATEN_CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


# Below this key length one batched matmul beats the aten kernel, whose fixed
# cost per (sequence, head) dominates tiny blocks; on longer keys aten wins by
# skipping masked tiles (figures: results/cpu_ops/README.md).
MATH_MAX_LEN = 32


def kernel_for(device: torch.device, dtype: torch.dtype, key_len: int | None = None) -> DenseKernel:
    """The kernel for tensors on ``device`` of ``dtype`` and key length: ``ATEN`` or ``MATH``."""
    if device.type != "cpu" or dtype not in _ATEN_CPU_DTYPES:
        return DenseKernel.MATH
    return DenseKernel.MATH if key_len is not None and key_len <= MATH_MAX_LEN else DenseKernel.ATEN


def _pick(kernel: DenseKernel | None, q: torch.Tensor, k: torch.Tensor) -> DenseKernel:
    return kernel_for(q.device, q.dtype, k.shape[-2]) if kernel in (None, DenseKernel.AUTO) else kernel


def dense_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    bias: torch.Tensor | None = None,
    kernel: DenseKernel | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention forward.

    Args:
        q: (N, H, Lq, D); k, v: (N, H, Lk, D).
        causal: top-left aligned causal mask (only used with Lq == Lk).
        bias: additive float bias broadcastable to (N, H, Lq, Lk), ``-inf``
            masks a key; q's dtype.
    Returns:
        out (N, H, Lq, D) in q's dtype, lse (N, H, Lq) in fp32 (fp64 for fp64 input).
    """
    if _pick(kernel, q, k) == DenseKernel.ATEN:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=bias, scale=scale
        )
        return out, lse
    logits = _masked_logits(q, k, causal=causal, scale=scale, bias=bias)
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse[..., None])
    out = torch.matmul(probs.to(v.dtype), v)
    return out, lse


def dense_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    bias: torch.Tensor | None = None,
    kernel: DenseKernel | None = None,
    partial: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax attention backward with a given ``(out, lse)``.

    With the merged ``out`` and ``lse`` of several partial attentions, the
    probabilities ``P = exp(S - lse)`` and ``D = rowsum(dout * out)`` are those
    of the whole attention, so summing the returned gradients over the parts
    gives the exact gradient of the merged output.

    ``partial``: the caller sums these gradients with others (query chunks that
    share keys, samples that share tokens), so they come back in the
    accumulation dtype (fp32 for fp16/bf16 inputs) and are rounded to the
    inputs' dtype once, by the caller, after the sum: a key seen by m calls
    would otherwise be rounded m times. fp16/bf16 inputs then run aten's kernel
    on fp32 copies: it returns its inputs' dtype, and its bf16 backward also
    sums dK, dV over its own query tiles in bf16 (3-5x the error of the fp32
    kernel rounded once, on one 1024-token block); on CPU it is no faster than
    the fp32 one. fp32 and fp64 inputs are unaffected.

    Shapes as in :func:`dense_fwd`; returns dq, dk, dv in the inputs' dtype
    (``partial``: the accumulation dtype).
    """
    acc = accum_dtype(q.dtype)
    if _pick(kernel, q, k) == DenseKernel.ATEN:
        if partial and q.dtype != acc:
            dout, q, k, v, out = (x.to(acc) for x in (dout, q, k, v, out))
            bias = None if bias is None else bias.to(acc)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse.to(acc), 0.0, causal, attn_mask=bias, scale=scale
        )
    logits = _masked_logits(q, k, causal=causal, scale=scale, bias=bias)
    probs = torch.exp(logits - lse.to(acc)[..., None])  # (N, H, Lq, Lk)
    dout_a, v_a = dout.to(acc), v.to(acc)
    dv = torch.matmul(probs.transpose(-1, -2), dout_a)
    dprobs = torch.matmul(dout_a, v_a.transpose(-1, -2))
    delta = (dout_a * out.to(acc)).sum(dim=-1, keepdim=True)
    dlogits = probs * (dprobs - delta) * scale
    dq = torch.matmul(dlogits, k.to(acc))
    dk = torch.matmul(dlogits.transpose(-1, -2), q.to(acc))
    if partial:
        return dq, dk, dv
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _masked_logits(q, k, *, causal: bool, scale: float, bias: torch.Tensor | None) -> torch.Tensor:
    """(N, H, Lq, Lk) logits in the accumulation dtype, masked entries -inf."""
    acc = accum_dtype(q.dtype)
    logits = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
    if bias is not None:
        logits = logits + bias.to(acc)
    if causal:
        logits.masked_fill_(_future_mask(*logits.shape[-2:], q.device), float("-inf"))
    return logits


@functools.lru_cache(maxsize=64)
def _future_mask(Lq: int, Lk: int, device: torch.device) -> torch.Tensor:
    """bool (Lq, Lk), True above the diagonal (keys after the query); cached per shape."""
    return torch.ones(Lq, Lk, dtype=torch.bool, device=device).triu(1)
