"""Exact ALiBi's one choice: the fused banded kernel or query chunks.

:func:`choose_alibi_kernel` answers once per call; the op and its backward
(:mod:`plsh_dist.ops.alibi`) and the sequence-parallel window form
(:mod:`plsh_dist.distributed.sp.alibi_window_halo`) take its answer and test nothing
again. PLSH's strategies have their table (:mod:`plsh_dist.ops.backends`, whose docstring
names this choice); this one sits apart, below ``alibi.py``, because the table's decoding
strategy imports ``alibi.py``.
"""

from __future__ import annotations

import enum

import torch

from plsh_dist.ops.triton import triton_cuda


class AlibiKernel(str, enum.Enum):
    """How exact (windowed, truncated) ALiBi runs."""

    FUSED = "fused"
    """The fused banded Triton kernel, each head over its window's key tiles (CUDA sm >= 80)."""
    CHUNKS = "chunks"
    """Query chunks against the keys they see, on dense calls (anywhere)."""


@torch.compiler.assume_constant_result
def choose_alibi_kernel(device: torch.device, dtype: torch.dtype, chunk_size: int | None) -> str:
    """:attr:`AlibiKernel.FUSED` where the fused kernel runs (CUDA sm >= 80 with Triton) and no
    ``chunk_size`` is asked for, else :attr:`AlibiKernel.CHUNKS`; as a str, what the ops take (a
    compiled call runs this once, while dynamo traces it: its answer is a constant of the graph)."""
    fused = chunk_size is None and triton_cuda(device, dtype)
    return (AlibiKernel.FUSED if fused else AlibiKernel.CHUNKS).value
