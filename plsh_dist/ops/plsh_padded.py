"""PLSH per sample on padded blocks: the CPU strategy (and any device on explicit matmuls).

Each sample's blocks of one hash head are padded to the longest and run as
one batched dense call (:mod:`plsh_dist.ops.padded_blocks`); the s samples
merge by log-sum-exp (:mod:`plsh_dist.ops.merge`). Backward calls every
sample's block backward with the merged ``out`` / ``lse`` and sums
(docs/design.md, section 1, "Backward"), so nothing per sample is kept between forward and backward: the
block layouts are cheap and recomputed, the strategy saves nothing (``saved`` is None).

Loop order, forward and backward: samples outer, hash heads inner (the order
in which a key/value head's gradient sums its query heads' parts).

Legend: B batch, T tokens, Hq / Hkv query / key-value heads, D head dim,
Hc query heads of one hash head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.block_layout import block_layout
from plsh_dist.ops.dense import DenseKernel
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.gqa import sum_kv_repeats
from plsh_dist.ops.head_groups import head_groups, group_inputs
from plsh_dist.ops.merge import accum_dtype, merge_into
from plsh_dist.ops.padded_blocks import block_bwd, block_fwd


def _sample_layouts(lsh: PositionalLSH, positions: torch.Tensor, device: torch.device, docs: Documents | None):
    """Yield, per sample, a function hash head -> its block layout (cheap, never stored)."""
    buckets = lsh.buckets(positions)  # (s, H, n) on CPU
    doc_starts = None if docs is None else docs.start_mask
    for t in range(buckets.shape[0]):
        yield lambda h, t=t: block_layout(buckets[t, h], device, doc_starts)


def padded_forward(q, k, v, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool, scale: float,
                   kernel: DenseKernel = DenseKernel.AUTO, docs: Documents | None = None):
    """Merged block attention over all samples.

    q: (B, T, Hq, D); k, v: (B, T, Hkv, D); positions CPU LongTensor[T], increasing
    (within each document of ``docs``, a batch-1 call's documents).
    Returns out (B, T, Hq, D) in q's dtype, lse (B, Hq, T) fp32 (fp64 for fp64).
    """
    groups = head_groups(lsh, q.shape[2], k.shape[2]).groups
    inputs = [group_inputs(q, k, v, g) for g in groups]
    out, lse = [None] * len(groups), [None] * len(groups)
    for layout_of in _sample_layouts(lsh, positions, q.device, docs):
        for i, (g, (q_g, k_g, v_g)) in enumerate(zip(groups, inputs)):
            o, l = block_fwd(q_g, k_g, v_g, layout_of(g.hash_head), causal=causal, scale=scale, kernel=kernel)
            out[i], lse[i] = merge_into(out[i], lse[i], o, l)  # (B, T, Hc, D), (B, Hc, T)
    return torch.cat(out, dim=2).to(q.dtype), torch.cat(lse, dim=1)


def padded_backward(dout, q, k, v, out, lse, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool,
                    scale: float, kernel: DenseKernel = DenseKernel.AUTO, docs: Documents | None = None):
    """Gradients of :func:`padded_forward`: every sample's block backward with the merged
    ``out`` and ``lse``, summed. Returns dq (B, T, Hq, D), dk, dv (B, T, Hkv, D) in the inputs' dtype."""
    B, T, Hq, D = q.shape
    heads = head_groups(lsh, Hq, k.shape[2])
    acc = accum_dtype(q.dtype)
    inputs = [(*group_inputs(q, k, v, g), *(x[:, :, g.q_heads].contiguous() for x in (dout, out)),
               lse[:, g.q_heads]) for g in heads.groups]
    kv_heads = Hq if heads.shared else k.shape[2]  # shared: k, v were repeated to the query heads
    dq = torch.zeros(B, T, Hq, D, dtype=acc, device=q.device)
    dk = torch.zeros(B, T, kv_heads, D, dtype=acc, device=q.device)
    dv = torch.zeros(B, T, kv_heads, D, dtype=acc, device=q.device)
    for layout_of in _sample_layouts(lsh, positions, q.device, docs):
        for g, (q_g, k_g, v_g, dout_g, out_g, lse_g) in zip(heads.groups, inputs):
            dq_g, dk_g, dv_g = block_bwd(dout_g, q_g, k_g, v_g, out_g, lse_g, layout_of(g.hash_head),
                                         causal=causal, scale=scale, kernel=kernel, partial=True)
            kv = g.q_heads if heads.shared else slice(g.kv_head, g.kv_head + 1)
            dq[:, :, g.q_heads] += dq_g
            dk[:, :, kv] += dk_g
            dv[:, :, kv] += dv_g
    if heads.shared:  # sum each key/value head's repeated copies back
        dk, dv = sum_kv_repeats(dk, heads.kv_repeat), sum_kv_repeats(dv, heads.kv_repeat)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@dataclass(frozen=True)
class PaddedPerSample:
    """Strategy: s block attentions on padded blocks, merged by log-sum-exp.

    ``kernel``: ``AUTO`` (aten's flash-attention-for-CPU, or explicit matmuls for
    short blocks, chosen per call by block length) or ``MATH`` (explicit matmuls).
    """

    kernel: DenseKernel = DenseKernel.AUTO
    onepass = False

    def forward(self, q, k, v, lsh, positions, *, causal, scale, docs=None):
        """``(out, lse, saved)``; ``saved`` is None (layouts are recomputed in backward)."""
        return (*padded_forward(q, k, v, lsh, positions, causal=causal, scale=scale, kernel=self.kernel,
                                docs=docs), None)

    def backward(self, dout, q, k, v, out, lse, lsh, positions, *, causal, scale, docs=None, saved=None):
        """``(dq, dk, dv)``."""
        return padded_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale,
                               kernel=self.kernel, docs=docs)
