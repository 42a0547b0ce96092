"""PLSH per sample on padded blocks: the CPU strategy (and any device on explicit matmuls).

Each sample's blocks of one hash head are padded to the longest and run as
one batched dense call (:func:`block_fwd`: every token attends, causally, to
its own block's tokens only; nothing n x n is built); the s samples
merge by log-sum-exp (:mod:`plsh_dist.ops.merge`). Backward calls every
sample's block backward with the merged ``out`` / ``lse`` and sums
(docs/design.md, section 1, "Backward"), so nothing per sample is kept between forward and backward: the
block grids are cheap and recomputed, the strategy saves nothing (``saved`` is None).

Loop order, forward and backward: samples outer, hash heads inner (the order
in which a key/value head's gradient sums its query heads' parts).

Legend: B batch, T tokens, Hq / Hkv query / key-value heads, D head dim,
Hc query heads of one hash head; in the block functions n tokens, G heads sharing a hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.cpu.blocks import BlockGrid, GroupedGrids, block_grid
from plsh_dist.ops.dense import DenseKernel, dense_bwd, dense_fwd
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.gqa import sum_kv_repeats
from plsh_dist.ops.head_groups import head_groups, group_inputs
from plsh_dist.ops.merge import accum_dtype, merge_into
from plsh_dist.ops.strategy import Strategy


def _sample_grids(lsh: PositionalLSH, positions: torch.Tensor, device: torch.device, docs: Documents | None):
    """Yield, per sample, a function hash head -> its block grid (cheap, never stored)."""
    buckets = lsh.buckets(positions)  # (s, H, n) on CPU
    doc_starts = None if docs is None else docs.start_mask
    for t in range(buckets.shape[0]):
        yield lambda h, t=t: block_grid(buckets[t, h], device, doc_starts)


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
    for grid_of in _sample_grids(lsh, positions, q.device, docs):
        for i, (g, (q_g, k_g, v_g)) in enumerate(zip(groups, inputs)):
            o, l = block_fwd(q_g, k_g, v_g, grid_of(g.hash_head), causal=causal, scale=scale, kernel=kernel)
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
    for grid_of in _sample_grids(lsh, positions, q.device, docs):
        for g, (q_g, k_g, v_g, dout_g, out_g, lse_g) in zip(heads.groups, inputs):
            dq_g, dk_g, dv_g = block_bwd(dout_g, q_g, k_g, v_g, out_g, lse_g, grid_of(g.hash_head),
                                         causal=causal, scale=scale, kernel=kernel, partial=True)
            kv = g.q_heads if heads.shared else slice(g.kv_head, g.kv_head + 1)
            dq[:, :, g.q_heads] += dq_g
            dk[:, :, kv] += dk_g
            dv[:, :, kv] += dv_g
    if heads.shared:  # sum each key/value head's repeated copies back
        dk, dv = sum_kv_repeats(dk, heads.kv_repeat), sum_kv_repeats(dv, heads.kv_repeat)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@dataclass(frozen=True)
class PaddedPerSample(Strategy):
    """Strategy: s block attentions on padded blocks, merged by log-sum-exp.

    ``kernel``: ``AUTO`` (aten's flash-attention-for-CPU, or explicit matmuls for
    short blocks, chosen per call by block length) or ``MATH`` (explicit matmuls).
    """

    kernel: DenseKernel = DenseKernel.AUTO
    onepass = False

    def forward(self, q, k, v, lsh, positions, *, causal, scale, docs=None):
        """``(out, lse, saved)``; ``saved`` is None (grids are recomputed in backward)."""
        return (*padded_forward(q, k, v, lsh, positions, causal=causal, scale=scale, kernel=self.kernel,
                                docs=docs), None)

    def backward(self, dout, q, k, v, out, lse, lsh, positions, *, causal, scale, docs=None, saved=None):
        """``(dq, dk, dv)``."""
        return padded_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale,
                               kernel=self.kernel, docs=docs)


# --- block attention on a padded batch of blocks (one sample, one head group) ---------------------


def _bias(grid: BlockGrid, batch: int, causal: bool, dtype: torch.dtype) -> torch.Tensor | None:
    """Padding-key bias (B * nb, 1, 1, L) for non-causal calls, else None."""
    if causal:
        return None
    bias = grid.pad_key_bias(dtype)
    if bias is None:
        return None
    return bias.expand(batch, *bias.shape).reshape(batch * grid.num_blocks, 1, 1, grid.max_len)


def block_fwd(
    q_BnGD: torch.Tensor,
    k_BnGD: torch.Tensor,
    v_BnGD: torch.Tensor,
    grid: BlockGrid,
    *,
    causal: bool,
    scale: float,
    kernel: DenseKernel | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise attention. Returns out (B, n, G, D) in q's dtype and lse (B, G, n).

    A :class:`GroupedGrids` runs one padded grid per block-length class (each part's
    grid gathers from the whole sequence and returns its own tokens)."""
    if isinstance(grid, GroupedGrids):
        B, n, G, _ = q_BnGD.shape
        out = torch.empty_like(q_BnGD)
        lse = None
        for part, tokens in grid.parts:
            o, l = block_fwd(q_BnGD, k_BnGD, v_BnGD, part, causal=causal, scale=scale, kernel=kernel)
            lse = l.new_empty(B, G, n) if lse is None else lse
            out.index_copy_(1, tokens, o)
            lse.index_copy_(2, tokens, l)
        return out, lse
    B = q_BnGD.shape[0]
    q, k, v = (grid.to_blocks(x) for x in (q_BnGD, k_BnGD, v_BnGD))  # (B * nb, G, L, D)
    out, lse = dense_fwd(q, k, v, causal=causal, scale=scale, bias=_bias(grid, B, causal, q.dtype), kernel=kernel)
    return grid.from_blocks(out, B), grid.lse_from_blocks(lse, B)


def block_bwd(
    dout_BnGD: torch.Tensor,
    q_BnGD: torch.Tensor,
    k_BnGD: torch.Tensor,
    v_BnGD: torch.Tensor,
    out_BnGD: torch.Tensor,
    lse_BGn: torch.Tensor,
    grid: BlockGrid,
    *,
    causal: bool,
    scale: float,
    kernel: DenseKernel | None = None,
    partial: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of :func:`block_fwd` given the merged ``out`` and ``lse``.

    Padding slots carry dout = 0, so they add nothing to dk, dv.
    Returns dq, dk, dv (B, n, G, D) in the inputs' dtype (``partial``: in the accumulation
    dtype, for a caller that sums them over samples, as :func:`~plsh_dist.ops.dense.dense_bwd`).
    """
    if isinstance(grid, GroupedGrids):  # blocks partition the tokens: each part writes its own
        dtype = accum_dtype(q_BnGD.dtype) if partial else q_BnGD.dtype
        grads = [torch.empty(x.shape, dtype=dtype, device=x.device) for x in (q_BnGD, k_BnGD, v_BnGD)]
        for part, tokens in grid.parts:
            part_grads = block_bwd(dout_BnGD, q_BnGD, k_BnGD, v_BnGD, out_BnGD, lse_BGn, part, causal=causal,
                                   scale=scale, kernel=kernel, partial=partial)
            for g, pg in zip(grads, part_grads):
                g.index_copy_(1, tokens, pg)
        return tuple(grads)
    B = q_BnGD.shape[0]
    q, k, v, out = (grid.to_blocks(x) for x in (q_BnGD, k_BnGD, v_BnGD, out_BnGD))
    dout = grid.to_blocks(dout_BnGD, zero_pads=True)
    lse = grid.lse_to_blocks(lse_BGn)
    bias = _bias(grid, B, causal, q.dtype)
    grads = dense_bwd(dout, q, k, v, out, lse, causal=causal, scale=scale, bias=bias, kernel=kernel,
                      partial=partial)
    return tuple(grid.from_blocks(g, B) for g in grads)
