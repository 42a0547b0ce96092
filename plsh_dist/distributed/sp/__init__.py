"""Sequence-parallel attention: one file per algorithm, each calling the
single-process ops of :mod:`plsh_dist.ops` downwards.

:mod:`plsh_dist.distributed.sp.attention` offers the ops' four functions over an SP
group (``group=``); each bias's sequence-parallel form calls one
(:mod:`plsh_dist.biases`).
"""

from plsh_dist.distributed.sp.attention import (alibi_attention, block_attention, causal_attention,
                                                fixed_blocks_attention, plsh_attention)

__all__ = ["plsh_attention", "fixed_blocks_attention", "block_attention", "alibi_attention", "causal_attention"]
