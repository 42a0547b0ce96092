"""Attention operators: positional LSH, exact ALiBi baselines, dense references.

Every function takes q (B, T, Hq, D) and k, v (B, T, Hkv, D) and returns
(B, T, Hq, D) in q's dtype.
"""

from plsh_dist.distributed.comm_stats import comm_stats, reset_comm_stats
from plsh_dist.ops.alibi import alibi_attention, causal_attention
from plsh_dist.ops.plsh import fixed_blocks_attention, plsh_attention

__all__ = [
    "plsh_attention",
    "fixed_blocks_attention",
    "alibi_attention",
    "causal_attention",
    "comm_stats",
    "reset_comm_stats",
]
