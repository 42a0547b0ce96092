"""The attention functions of :mod:`plsh_dist.ops`, for one rank's chunk of a
sequence split over a sequence-parallel group.

Four functions with the arguments of the single-process ops (``return_lse``
aside) plus the SP ``group`` (as ring-flash-attention's take theirs): each rank
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

Each bias's sequence-parallel form (:mod:`plsh_dist.biases`) calls its function; a model
attends over a group once :func:`plsh_dist.models.parallelize.apply_sequence_parallel` set it.
Every rank of the group must make the same calls in the same order (each call starts with one
small all-gather that checks the ranks agree).

Under ``torch.compile`` each function is one custom op of the graph
(:mod:`plsh_dist.distributed.sp.custom_ops`), which checks its arguments inside: ``seed`` may then be
an int64 scalar tensor (a graph input: a new step is not a new graph), and ``positions`` the raw
``position_ids`` (B, T_local) of the chunk, laid out inside the op.
"""

from __future__ import annotations

import torch

from plsh_dist.distributed.sp.alibi_allgather import SPAlibiGather
from plsh_dist.distributed.sp.alibi_window_halo import SPAlibiWindow
from plsh_dist.distributed.sp.custom_ops import sp_alibi_attention_op, sp_block_attention_op
from plsh_dist.distributed.sp.plsh_halo import SPBlockAttention
from plsh_dist.hashing import FixedBlocks, PositionalLSH
from plsh_dist.ops.alibi import check_alibi_attention, check_window, check_window_tensor, window_list
from plsh_dist.ops.alibi_kernel import choose_alibi_kernel
from plsh_dist.ops.backends import choose_strategy, chosen_name
from plsh_dist.ops.input_checks import check_qkv, softmax_scale_for
from plsh_dist.ops.plsh import check_block_attention, op_args


def _check_group(group) -> None:
    if group is None:
        raise ValueError("sequence-parallel attention needs a process group; use plsh_dist.ops in one process")


def plsh_attention(q, k, v, *, group, sigma, num_samples: int, seed: int, positions=None, causal: bool = True,
                   softmax_scale: float | None = None, backend: str = "auto", sampler: str = "iid",
                   method: str = "auto", cu_seqlens=None):
    """:func:`plsh_dist.ops.plsh_attention` of this rank's chunk over ``group``: (B, T_local, Hq, D).

    Both methods move the same halo: the one-pass band is the union of the samples' blocks.
    """
    return block_attention(q, k, v, PositionalLSH(sigma, num_samples, seed, sampler), group=group, positions=positions,
                           causal=causal, softmax_scale=softmax_scale, backend=backend, method=method,
                           cu_seqlens=cu_seqlens)


def fixed_blocks_attention(q, k, v, *, group, sigma, positions=None, causal: bool = True,
                           softmax_scale: float | None = None, backend: str = "auto", method: str = "auto",
                           cu_seqlens=None):
    """:func:`plsh_dist.ops.fixed_blocks_attention` of this rank's chunk over ``group``."""
    return block_attention(q, k, v, FixedBlocks(sigma), group=group, positions=positions, causal=causal,
                           softmax_scale=softmax_scale, backend=backend, method=method, cu_seqlens=cu_seqlens)


def block_attention(q, k, v, lsh, *, group, positions, causal, softmax_scale, backend, method, cu_seqlens):
    """The blocks of hash ``lsh`` (PLSH, or :class:`~plsh_dist.hashing.FixedBlocks`) over ``group``: a halo of
    keys/values. Compiled, the custom op (given the hash's :func:`~plsh_dist.ops.plsh.op_args`); eagerly,
    :class:`SPBlockAttention`, which keeps the halo for its backward."""
    _check_group(group)
    if torch.compiler.is_compiling():
        strategy = chosen_name(_name(backend), _name(method), q.device, q.dtype, lsh.num_samples)
        return sp_block_attention_op(q, k, v, positions, cu_seqlens, *op_args(lsh), causal, softmax_scale, strategy,
                                     group.group_name, _needs_grad(q, k, v))[0]
    strategy = choose_strategy(backend, method, q.device, q.dtype, lsh.num_samples)
    pos, scale, _ = check_block_attention(q, k, v, lsh, positions, softmax_scale)
    return SPBlockAttention.apply(q, k, v, lsh, pos, causal, scale, strategy, group, cu_seqlens)


def _name(choice) -> str:
    """A backend or method (a str, or its enum) as the op takes it."""
    return str(getattr(choice, "value", choice))


def _needs_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))


def alibi_attention(q, k, v, *, group, slopes, positions=None, causal: bool = True, window=None,
                    softmax_scale: float | None = None, chunk_size: int | None = None, cu_seqlens=None):
    """:func:`plsh_dist.ops.alibi_attention` of this rank's chunk over ``group`` (exact: all-gather;
    windowed, one window or one per head: a halo of the widest window)."""
    _check_group(group)
    if torch.compiler.is_compiling():  # a window tensor's values are checked inside the op (graph data)
        window_tensor = check_window_tensor(window, q.shape[2]) if isinstance(window, torch.Tensor) else None
        window = [] if window_tensor is not None else window_list(check_window(window, q.shape[2]))
        return sp_alibi_attention_op(q, k, v, positions, cu_seqlens, torch.as_tensor(slopes, dtype=torch.float32),
                                     window, causal, softmax_scale, chunk_size,
                                     choose_alibi_kernel(q.device, q.dtype, chunk_size), group.group_name,
                                     _needs_grad(q, k, v), window_tensor)[0]
    slopes, pos, scale, window = check_alibi_attention(q, k, v, slopes, positions, window, softmax_scale,
                                                       chunk_size)
    if window is None:
        return SPAlibiGather.apply(q, k, v, pos, slopes, causal, scale, chunk_size, group, cu_seqlens)
    return SPAlibiWindow.apply(q, k, v, pos, slopes, causal, window, scale, chunk_size,
                               choose_alibi_kernel(q.device, q.dtype, chunk_size), group, cu_seqlens)


def causal_attention(q, k, v, *, group, positions=None, causal: bool = True, softmax_scale: float | None = None,
                     cu_seqlens=None):
    """:func:`plsh_dist.ops.causal_attention` of this rank's chunk over ``group``: exact attention
    over the all-gathered keys (zero ALiBi slopes)."""
    check_qkv(q, k, v)
    scale = softmax_scale_for(q, softmax_scale)
    return alibi_attention(q, k, v, group=group, slopes=torch.zeros(q.shape[2]), positions=positions, causal=causal,
                           softmax_scale=scale, cu_seqlens=cu_seqlens)
