"""The varlen kernel signature on padded explicit matmuls (``VarlenKernel.REFERENCE``).

Runs each varlen call as the CPU strategy would (blocks padded into one batched
matmul), on any device, so the CPU tests exercise everything the CUDA strategy
does around its kernels: the rows layout, the calls' chunks, the merge.

Legend: R rows, Hc query heads of the call, Hkc key/value heads, D head dim.
"""

from __future__ import annotations

import torch

from plsh_dist.ops.cpu import BlockGrid, block_bwd, block_fwd
from plsh_dist.ops.dense import DenseKernel
from plsh_dist.ops.gqa import repeat_kv, sum_kv_repeats


def _grid(cu: torch.Tensor) -> BlockGrid:
    """The padded grid of the sequences ``cu`` (int32 (nseq + 1,)) cuts the rows into."""
    lengths = (cu[1:] - cu[:-1]).long().cpu()
    return BlockGrid.from_buckets(torch.repeat_interleave(torch.arange(lengths.numel()), lengths), cu.device)


def reference_fwd(q_RHD, k_RHD, v_RHD, cu, *, causal: bool, scale: float):
    """As ``varlen_fwd``: out (R, Hc, D), lse (Hc, R)."""
    g = q_RHD.shape[1] // k_RHD.shape[1]
    k, v = (repeat_kv(x, g, dim=1)[None] for x in (k_RHD, v_RHD))
    out, lse = block_fwd(q_RHD[None], k, v, _grid(cu), causal=causal, scale=scale, kernel=DenseKernel.MATH)
    return out[0], lse[0]


def reference_bwd(dout_RHD, q_RHD, k_RHD, v_RHD, out_RHD, lse_HR, cu, *, causal: bool, scale: float):
    """As ``varlen_bwd``: dq (R, Hc, D), dk, dv (R, Hkc, D)."""
    g = q_RHD.shape[1] // k_RHD.shape[1]
    k, v = (repeat_kv(x, g, dim=1)[None] for x in (k_RHD, v_RHD))
    dq, dk, dv = block_bwd(dout_RHD[None], q_RHD[None], k, v, out_RHD[None], lse_HR[None], _grid(cu),
                           causal=causal, scale=scale, kernel=DenseKernel.MATH)
    return dq[0], sum_kv_repeats(dk[0], g, dim=1), sum_kv_repeats(dv[0], g, dim=1)
