"""Attention operators of one process: positional LSH, exact ALiBi baselines, dense references.

Every function takes q (B, T, Hq, D) and k, v (B, T, Hkv, D) and returns
(B, T, Hq, D) in q's dtype (and, with ``return_lse=True``, the log-sum-exp
(B, Hq, T)). Nothing here communicates: sequence-parallel versions of the same
functions live in :mod:`plsh_dist.distributed.sp`.
"""

from plsh_dist.ops.alibi import alibi_attention, causal_attention
from plsh_dist.ops.backends import BACKENDS, Backend
from plsh_dist.ops.plsh import fixed_blocks_attention, plsh_attention

__all__ = [
    "plsh_attention",
    "fixed_blocks_attention",
    "alibi_attention",
    "causal_attention",
    "Backend",
    "BACKENDS",
]
