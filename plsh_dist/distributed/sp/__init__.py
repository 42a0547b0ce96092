"""Sequence-parallel attention: one file per algorithm, each calling the
single-process ops of :mod:`plsh_dist.ops` downwards.

:class:`SequenceParallelAttention` offers the ops' four functions over an SP
group; the model side binds it to a model's attention modules
(:func:`plsh_dist.models.apply_sequence_parallel`).
"""

from plsh_dist.distributed.sp.attention import SequenceParallelAttention

__all__ = ["SequenceParallelAttention"]
