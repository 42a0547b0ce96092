"""The one-pass band: each query's block starts and the count bias ``log c``.

Shared by the one-pass strategy (:mod:`plsh_dist.ops.cpu.onepass`) and decoding
(:mod:`plsh_dist.ops.decode`): query ``i`` weights key ``j`` by
``c_ij = #{t : first_t(i) <= j < end_t(i)}`` (causally ``end_t(i) = i + 1`` for
every sample), the number of samples whose block holding ``i`` also holds
``j``, and attends with the bias ``log c_ij`` (``-inf`` where ``c = 0``).

Block bounds come from the hash itself (:meth:`PositionalLSH.block_bounds`,
O(s) per query), so a chunk of queries never needs a table over the whole
sequence, and the blocks are bit for bit those of ``lsh.buckets``.

Legend: s samples, C queries of one row group, K keys of its range, Hh hash heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plsh_dist.hashing import PositionalLSH


def block_firsts(lsh: PositionalLSH, positions: torch.Tensor) -> torch.Tensor:
    """First position of the block holding each of ``positions`` (CPU LongTensor[m]), in every
    sample of every hash head: LongTensor (Hh, m, s)."""
    firsts = [lsh.block_bounds(positions, h, ends=False)[0] for h in range(lsh.num_heads)]  # (s, m) each
    return torch.stack(firsts).permute(0, 2, 1).contiguous()


def log_count_bias(first: torch.Tensor, stop: torch.Tensor, weight: float, num_keys: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """``log c`` over a key range of ``num_keys`` keys: (..., C, K) in ``dtype``, ``-inf`` where c = 0.

    Args:
        first: LongTensor (..., C, s), key index in [0, K) of each query's block start in
            every sample.
        stop: LongTensor (..., C, r), key index one past each block's end (may be >= K: the
            block ends after the range); causal: (..., C, 1), one past the query, with
            ``weight = s`` (every sample's block is cut there), else the s block ends with
            ``weight = 1``.

    Each query's row gets +1 at its s block starts and ``-weight`` at the stops; the
    cumulative sum along the keys is then exactly c (small integers are exact in
    float), and its logarithm the bias. O(C s) scattered values and a few passes over
    the (C, K) table, whatever s: sorting the starts or comparing bucket ids costs more
    (measured).
    """
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    hist = torch.zeros(*first.shape[:-1], num_keys, dtype=acc)
    hist.scatter_add_(-1, first, torch.ones(first.shape, dtype=acc))
    # a block that ends past the range's last key needs no decrement
    hist.scatter_add_(-1, stop.clamp(max=num_keys - 1), torch.where(stop < num_keys, -weight, 0.0).to(acc))
    # log 0 = -inf for keys outside every block, but log of 0 takes a slow path
    # (figures: results/cpu_ops/README.md), so the zeros become 0.5 first: below
    # log 1 = 0, they are the negative entries afterwards, set to -inf in one
    # in-place pass (threshold_: no boolean mask).
    bias = hist.cumsum_(dim=-1).clamp_(min=0.5).log_()
    return F.threshold_(bias, -0.5, float("-inf")).to(dtype)
