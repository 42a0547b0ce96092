"""Apply sequence parallelism to a built model, once (torchtitan's ``parallelize_*``).

The model side applies parallelism, so :mod:`plsh_dist.distributed` never
imports the models: every attention module calls whatever attention-ops object
is bound to it (the single-process :mod:`plsh_dist.ops` by default), and this
module binds :class:`~plsh_dist.distributed.sp.SequenceParallelAttention`
there. The trainer and evaluation call :func:`apply_sequence_parallel` once
after building or loading the model; no process group travels through the
model's forward.
"""

from __future__ import annotations

from torch import nn

from plsh_dist.distributed.sp.attention import SequenceParallelAttention
from plsh_dist.models.build import set_attention_ops


def apply_sequence_parallel(model: nn.Module, group) -> nn.Module:
    """Make every attention module of ``model`` attend over the SP ``group``.

    Each rank then feeds its contiguous chunk with its chunk's global
    ``position_ids``. ``group=None`` (no sequence parallelism) binds the
    single-process ops back. Returns the model.
    """
    return set_attention_ops(model, SequenceParallelAttention(group) if group is not None else None)
