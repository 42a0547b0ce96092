"""The attention functions of :mod:`plsh_dist.ops`, for one rank's chunk of a
sequence split over a sequence-parallel group.

``SequenceParallelAttention(group)`` has the same four functions, with the
same arguments, as the single-process ops (``return_lse`` aside): each rank
passes its contiguous chunk of q, k, v (B, T_local, H, D) and its chunk's
*global* positions (:func:`plsh_dist.distributed.sp_chunks.sp_positions`),
and gets its chunk of the output. Arguments are validated by the ops' own
checks, so a bad call fails with the same message as in one process. Which
algorithm runs:

    plsh_attention, fixed_blocks_attention   halo of keys/values   (plsh_halo.py)
    alibi_attention(window=None)             all-gather K/V        (alibi_allgather.py)
    alibi_attention(window=w)                halo of w - 1         (alibi_window_halo.py)
                                             (per-head w_h: of max w_h - 1)
    causal_attention                         all-gather, zero slopes

Packed documents: ``cu_seqlens`` are the offsets over the flattened *whole*
(B, P * T_local) batch, the same tensor on every rank (checked), in the
ops' convention; positions stay the chunk's increasing global positions
(restarting positions cannot be split over ranks: pass offsets instead).
Halos stop at document starts (:mod:`plsh_dist.distributed.sp.documents`).

Bind it to a model once with :func:`plsh_dist.models.parallelize.apply_sequence_parallel`.
"""

from __future__ import annotations

import torch

from plsh_dist.distributed.sp.alibi_allgather import SPAlibiGather
from plsh_dist.distributed.sp.alibi_window_halo import SPAlibiWindow
from plsh_dist.distributed.sp.plsh_halo import SPBlockAttention
from plsh_dist.hashing import FixedBlocks, PositionalLSH
from plsh_dist.ops.alibi import check_alibi_attention
from plsh_dist.ops.input_checks import check_qkv, softmax_scale_for
from plsh_dist.ops.plsh import check_block_attention


class SequenceParallelAttention:
    """Attention over the ranks of ``group`` (group rank r holds the r-th chunk).

    Every rank of the group must make the same calls in the same order (each
    call starts with one small all-gather that checks the ranks agree).
    """

    def __init__(self, group):
        if group is None:
            raise ValueError("SequenceParallelAttention needs a process group; use plsh_dist.ops in one process")
        self.group = group

    def __repr__(self) -> str:
        return f"{type(self).__name__}(group={self.group!r})"

    def plsh_attention(self, q, k, v, *, sigma, num_samples: int, seed: int, positions=None, causal: bool = True,
                       softmax_scale: float | None = None, backend: str = "auto", sampler: str = "iid",
                       method: str = "auto", cu_seqlens=None):
        """:func:`plsh_dist.ops.plsh_attention` of this rank's chunk: (B, T_local, Hq, D).

        Both methods move the same halo: the one-pass band is the union of the samples' blocks.
        """
        return self._blocks(q, k, v, PositionalLSH(sigma, num_samples, seed, sampler), positions, causal,
                            softmax_scale, backend, method, cu_seqlens)

    def fixed_blocks_attention(self, q, k, v, *, sigma, positions=None, causal: bool = True,
                               softmax_scale: float | None = None, backend: str = "auto", method: str = "auto",
                               cu_seqlens=None):
        """:func:`plsh_dist.ops.fixed_blocks_attention` of this rank's chunk."""
        return self._blocks(q, k, v, FixedBlocks(sigma), positions, causal, softmax_scale, backend, method,
                            cu_seqlens)

    def alibi_attention(self, q, k, v, *, slopes, positions=None, causal: bool = True, window=None,
                        softmax_scale: float | None = None, chunk_size: int | None = None, cu_seqlens=None):
        """:func:`plsh_dist.ops.alibi_attention` of this rank's chunk (exact: all-gather; windowed,
        one window or one per head: a halo of the widest window)."""
        slopes, pos, scale, window = check_alibi_attention(q, k, v, slopes, positions, window, softmax_scale,
                                                           chunk_size)
        if window is None:
            return SPAlibiGather.apply(q, k, v, pos, slopes, causal, scale, chunk_size, self.group, cu_seqlens)
        return SPAlibiWindow.apply(q, k, v, pos, slopes, causal, window, scale, chunk_size, self.group, cu_seqlens)

    def causal_attention(self, q, k, v, *, positions=None, causal: bool = True, softmax_scale: float | None = None,
                         cu_seqlens=None):
        """:func:`plsh_dist.ops.causal_attention` of this rank's chunk: exact attention
        over the all-gathered keys (zero ALiBi slopes)."""
        check_qkv(q, k, v)
        scale = softmax_scale_for(q, softmax_scale)
        return self.alibi_attention(q, k, v, slopes=torch.zeros(q.shape[2]), positions=positions, causal=causal,
                                    softmax_scale=scale, cu_seqlens=cu_seqlens)

    def _blocks(self, q, k, v, lsh, positions, causal, softmax_scale, backend, method, cu_seqlens):
        pos, scale, strategy, _ = check_block_attention(q, k, v, lsh, positions, softmax_scale, backend, method)
        return SPBlockAttention.apply(q, k, v, lsh, pos, causal, scale, strategy, self.group, cu_seqlens)

