"""The sequence-parallel forms as ``torch.library`` custom ops, so a compiled decoder layer under
sequence parallelism stays one graph (as :mod:`plsh_dist.ops.custom_ops` does for one process).

    op                                 computes                                      backward op
    plsh_dist::sp_block_attention      PLSH / fixed blocks: a halo (plsh_halo.py)    plsh_dist::sp_block_attention_backward
    plsh_dist::sp_alibi_attention      ALiBi: all-gather (no window,                 plsh_dist::sp_alibi_attention_backward
                                       alibi_allgather.py) or a halo (a window,
                                       alibi_window_halo.py)

Their arguments are the single-process ops' (raw ``position_ids`` or the chunk's global positions,
laid out inside the op; the strategy, or ALiBi's kernel, the caller chose, by name) plus two: ``group_name``, c10d's name of the SP group (an op takes strings,
not process groups; PyTorch's functional collectives pass theirs alike), and ``needs_grad``, whether a
backward follows (every rank must agree on it, and autograd is not visible inside an op). Each op is
opaque to dynamo and inductor: its collectives run inside it, in the order the eager forms issue them,
on every rank alike.

The autograd formula (:func:`~plsh_dist.ops.custom_ops.register_autograd`) saves q, k, v, out, lse and
nothing an op cannot return, so the backward op plans the call again and fetches the halo (all-gathers
the keys) again before computing the eager form's backward: one more halo exchange (all-gather) per
layer in the backward, counted there by :mod:`~plsh_dist.distributed.comm_stats`, and the halo (every
rank's keys, for exact ALiBi) is not held from forward to backward. Eager calls keep the autograd
Functions, which save it.

Legend: B batch, T local tokens, Hq query heads, D head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.distributed_c10d import _resolve_process_group

from plsh_dist.distributed.comm_stats import record_call
from plsh_dist.distributed.sp.alibi_allgather import GatherPlan
from plsh_dist.distributed.sp.alibi_window_halo import WindowPlan
from plsh_dist.distributed.sp.plsh_halo import HaloPlan
from plsh_dist.ops.alibi import check_alibi_attention, op_window
from plsh_dist.ops.custom_ops import NAMESPACE, fake_backward, fake_forward, register_autograd
from plsh_dist.ops.layout import host_layout
from plsh_dist.ops.backends import strategy_named
from plsh_dist.ops.plsh import check_block_attention, op_hash


def _block_plan(q, k, v, positions, cu_seqlens, seed, sigma, num_samples, sampler, fixed, causal, softmax_scale,
                strategy, group_name, needs_grad) -> HaloPlan:
    lsh = op_hash(seed, sigma, num_samples, sampler, fixed)
    positions, cu_seqlens = host_layout(positions, cu_seqlens, q, True)
    pos, scale, _ = check_block_attention(q, k, v, lsh, positions, softmax_scale)
    return HaloPlan.make(q, k, lsh, pos, causal, scale, strategy_named(strategy), _resolve_process_group(group_name),
                         cu_seqlens, needs_grad)


@torch.library.custom_op(f"{NAMESPACE}::sp_block_attention", mutates_args=())
def sp_block_attention_op(q: Tensor, k: Tensor, v: Tensor, positions: Tensor | None, cu_seqlens: Tensor | None,
                          seed: Tensor, sigma: Tensor, num_samples: int, sampler: str, fixed: bool, causal: bool,
                          softmax_scale: float | None, strategy: str, group_name: str,
                          needs_grad: bool) -> tuple[Tensor, Tensor]:
    """PLSH (``fixed``: fixed blocks) over the SP group ``group_name``: ``(out, lse)`` of this rank's chunk,
    (B, T, Hq, D) and (B, Hq, T), on the strategy named ``strategy``."""
    plan = _block_plan(q, k, v, positions, cu_seqlens, seed, sigma, num_samples, sampler, fixed, causal,
                       softmax_scale, strategy, group_name, needs_grad)
    record_call()
    out, lse, _, _ = plan.forward(q, k, v)
    return out, lse


@sp_block_attention_op.register_fake
def _(q, k, v, *_params):
    return fake_forward(q)


@torch.library.custom_op(f"{NAMESPACE}::sp_block_attention_backward", mutates_args=())
def sp_block_attention_op_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                   positions: Tensor | None, cu_seqlens: Tensor | None, seed: Tensor, sigma: Tensor,
                                   num_samples: int, sampler: str, fixed: bool, causal: bool,
                                   softmax_scale: float | None, strategy: str, group_name: str,
                                   needs_grad: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`sp_block_attention_op`: the call planned again (its strategy looked up, not
    chosen again), the halo fetched again."""
    plan = _block_plan(q, k, v, positions, cu_seqlens, seed, sigma, num_samples, sampler, fixed, causal,
                       softmax_scale, strategy, group_name, needs_grad)
    halo = plan.fetch(k, v, phase="bwd")
    saved = plan.forward_state(q, k, v, halo) if plan.strategy.backward_takes_saved else (None, None)
    return tuple(g.contiguous() for g in plan.backward(dout, q, k, v, out, lse, halo, saved))


@sp_block_attention_op_backward.register_fake
def _(dout, q, k, v, *_params):
    return fake_backward(q, k, v)


register_autograd(sp_block_attention_op, sp_block_attention_op_backward)


def _alibi_plan(q, k, v, positions, cu_seqlens, slopes, window, causal, softmax_scale, chunk_size, kernel,
                group_name, needs_grad, window_tensor) -> GatherPlan | WindowPlan:
    """The all-gather's plan (no window) or the halo's (``window`` [w] or one per head, or ``window_tensor``)."""
    positions, cu_seqlens = host_layout(positions, cu_seqlens, q, True)
    window = op_window(window, window_tensor, q.shape[2])
    win = None if not window else window[0] if len(window) == 1 else tuple(window)
    slopes, pos, scale, win = check_alibi_attention(q, k, v, slopes, positions, win, softmax_scale, chunk_size)
    group = _resolve_process_group(group_name)
    if win is None:
        return GatherPlan.make(q, k, pos, slopes, causal, scale, chunk_size, group, cu_seqlens, needs_grad)
    return WindowPlan.make(q, k, pos, slopes, causal, win, scale, chunk_size, kernel, group, cu_seqlens, needs_grad)


@torch.library.custom_op(f"{NAMESPACE}::sp_alibi_attention", mutates_args=())
def sp_alibi_attention_op(q: Tensor, k: Tensor, v: Tensor, positions: Tensor | None, cu_seqlens: Tensor | None,
                          slopes: Tensor, window: list[int], causal: bool, softmax_scale: float | None,
                          chunk_size: int | None, kernel: str, group_name: str, needs_grad: bool,
                          window_tensor: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Exact ALiBi (``window``: [] none, [w] one for every head, or one per head; or ``window_tensor``,
    LongTensor[Hq], checked here) over the SP group ``group_name``: ``(out, lse)`` of this rank's chunk
    (``kernel``: the caller's :func:`~plsh_dist.ops.alibi_kernel.choose_alibi_kernel`)."""
    plan = _alibi_plan(q, k, v, positions, cu_seqlens, slopes, window, causal, softmax_scale, chunk_size, kernel,
                       group_name, needs_grad, window_tensor)
    record_call()
    if isinstance(plan, GatherPlan):
        out, lse = plan.forward(q, plan.gather(k, v))
    else:
        out, lse, _, _ = plan.forward(q, k, v)
    return out.contiguous(), lse.contiguous()


@sp_alibi_attention_op.register_fake
def _(q, k, v, *_params):
    return fake_forward(q)


@torch.library.custom_op(f"{NAMESPACE}::sp_alibi_attention_backward", mutates_args=())
def sp_alibi_attention_op_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                   positions: Tensor | None, cu_seqlens: Tensor | None, slopes: Tensor,
                                   window: list[int], causal: bool, softmax_scale: float | None,
                                   chunk_size: int | None, kernel: str, group_name: str, needs_grad: bool,
                                   window_tensor: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`sp_alibi_attention_op`: the keys gathered (the halo fetched) again."""
    plan = _alibi_plan(q, k, v, positions, cu_seqlens, slopes, window, causal, softmax_scale, chunk_size, kernel,
                       group_name, needs_grad, window_tensor)
    if isinstance(plan, GatherPlan):
        dq, dk, dv = plan.backward(dout, q, plan.gather(k, v, phase="bwd"), out, lse)
        return dq.contiguous(), dk.clone(), dv.clone()  # dk, dv: views of one reduce-scattered buffer
    grads = plan.backward(dout, q, k, v, out, lse, plan.fetch(k, v, phase="bwd"))
    return tuple(g.contiguous() for g in grads)


@sp_alibi_attention_op_backward.register_fake
def _(dout, q, k, v, *_params):
    return fake_backward(q, k, v)


register_autograd(sp_alibi_attention_op, sp_alibi_attention_op_backward)
