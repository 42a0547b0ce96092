"""Sequence-parallel attention: one file per algorithm, each calling the
single-process ops of :mod:`plsh_dist.ops` downwards.

- :class:`SequenceParallelAttention`: the ops' four functions over an SP group;
- :func:`apply_sequence_parallel`: bind it to every attention module of a model, once.
"""

from plsh_dist.distributed.sp.apply import apply_sequence_parallel
from plsh_dist.distributed.sp.attention import SequenceParallelAttention

__all__ = ["SequenceParallelAttention", "apply_sequence_parallel"]
