"""Block attention on a padded batch of blocks: the CPU strategies (and any device via math).

One call handles one (sample, head-group): every token attends (causally) to
the tokens of its own block only. Blocks are padded to the longest one and run
as a single batched dense call (see :mod:`plsh_dist.ops.block_layout`); nothing
n x n is ever built.

Legend: B batch, n tokens, G heads sharing this hash, D head dim.
"""

from __future__ import annotations

import torch

from plsh_dist.ops.block_layout import BlockLayout, GroupedLayout
from plsh_dist.ops.dense import DenseKernel, dense_bwd, dense_fwd
from plsh_dist.ops.merge import accum_dtype


def _bias(layout: BlockLayout, batch: int, causal: bool, dtype: torch.dtype) -> torch.Tensor | None:
    """Padding-key bias (B * nb, 1, 1, L) for non-causal calls, else None."""
    if causal:
        return None
    bias = layout.pad_key_bias(dtype)
    if bias is None:
        return None
    return bias.expand(batch, *bias.shape).reshape(batch * layout.num_blocks, 1, 1, layout.max_len)


def block_fwd(
    q_BnGD: torch.Tensor,
    k_BnGD: torch.Tensor,
    v_BnGD: torch.Tensor,
    layout: BlockLayout,
    *,
    causal: bool,
    scale: float,
    kernel: DenseKernel | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise attention. Returns out (B, n, G, D) in q's dtype and lse (B, G, n).

    A :class:`GroupedLayout` runs one padded grid per block-length class (each part's
    layout gathers from the whole sequence and returns its own tokens)."""
    if isinstance(layout, GroupedLayout):
        B, n, G, _ = q_BnGD.shape
        out = torch.empty_like(q_BnGD)
        lse = None
        for part, tokens in layout.parts:
            o, l = block_fwd(q_BnGD, k_BnGD, v_BnGD, part, causal=causal, scale=scale, kernel=kernel)
            lse = l.new_empty(B, G, n) if lse is None else lse
            out.index_copy_(1, tokens, o)
            lse.index_copy_(2, tokens, l)
        return out, lse
    B = q_BnGD.shape[0]
    q, k, v = (layout.to_blocks(x) for x in (q_BnGD, k_BnGD, v_BnGD))  # (B * nb, G, L, D)
    out, lse = dense_fwd(q, k, v, causal=causal, scale=scale, bias=_bias(layout, B, causal, q.dtype), kernel=kernel)
    return layout.from_blocks(out, B), layout.lse_from_blocks(lse, B)


def block_bwd(
    dout_BnGD: torch.Tensor,
    q_BnGD: torch.Tensor,
    k_BnGD: torch.Tensor,
    v_BnGD: torch.Tensor,
    out_BnGD: torch.Tensor,
    lse_BGn: torch.Tensor,
    layout: BlockLayout,
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
    if isinstance(layout, GroupedLayout):  # blocks partition the tokens: each part writes its own
        dtype = accum_dtype(q_BnGD.dtype) if partial else q_BnGD.dtype
        grads = [torch.empty(x.shape, dtype=dtype, device=x.device) for x in (q_BnGD, k_BnGD, v_BnGD)]
        for part, tokens in layout.parts:
            part_grads = block_bwd(dout_BnGD, q_BnGD, k_BnGD, v_BnGD, out_BnGD, lse_BGn, part, causal=causal,
                                   scale=scale, kernel=kernel, partial=partial)
            for g, pg in zip(grads, part_grads):
                g.index_copy_(1, tokens, pg)
        return tuple(grads)
    B = q_BnGD.shape[0]
    q, k, v, out = (layout.to_blocks(x) for x in (q_BnGD, k_BnGD, v_BnGD, out_BnGD))
    dout = layout.to_blocks(dout_BnGD, zero_pads=True)
    lse = layout.lse_to_blocks(lse_BGn)
    bias = _bias(layout, B, causal, q.dtype)
    grads = dense_bwd(dout, q, k, v, out, lse, causal=causal, scale=scale, bias=bias, kernel=kernel,
                      partial=partial)
    return tuple(layout.from_blocks(g, B) for g in grads)
