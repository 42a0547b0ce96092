"""The attention ops as ``torch.library`` custom ops, so a compiled model keeps one graph.

``torch.compile`` cannot trace the ops' insides: the hash draws in uint64 numpy,
block layouts and query chunks are host integers read from position tensors
(``.item()``, ``.tolist()``, data-dependent shapes). As flash-attn does for its
kernels, each entry point is one opaque op of the graph with a fake (meta)
implementation giving its outputs' shapes and dtypes, and an autograd formula
calling the op's backward, itself an op:

    op                                   returns                    backward op
    plsh_dist::block_attention           out (B, T, Hq, D), lse     plsh_dist::block_attention_backward
    plsh_dist::alibi_attention           out (B, T, Hq, D), lse     plsh_dist::alibi_attention_backward
    plsh_dist::layer_seed                a layer's hash seed        (none: integers)

``out`` is contiguous in q's dtype, ``lse`` (B, Hq, T) contiguous fp32 (fp64 for fp64
inputs) and not differentiable; the gradients are contiguous in their input's dtype.

A custom op takes tensors, ints, floats, bools and strings only, so what the graph
carries rebuilds everything else inside the op: the hash (:class:`PositionalLSH`, or
:class:`FixedBlocks` with ``fixed``) from ``sigma`` (float64 Tensor[H], H = 1 for one
hash shared by all heads), ``num_samples``, ``sampler`` and ``seed`` (an int64 scalar
tensor, so a new step's seed is a new input value, not a new graph), the strategy
from the ``backend`` / ``method`` strings (:func:`~plsh_dist.ops.backends.choose_strategy`),
the window from a list of ints. Positions and documents: ``positions`` and
``cu_seqlens`` as the public functions take them, or, with ``from_position_ids``,
transformers' raw ``position_ids`` and packed offsets, laid out inside the op
(:func:`~plsh_dist.ops.documents.layout_of_position_ids`).

The autograd formula saves q, k, v, out, lse and keeps the small host tensors above
(positions, offsets, seed, sigma or slopes) as parameters, nothing per sample; the backward
op rebuilds the hash and the layouts and calls the strategy's backward (or
:func:`~plsh_dist.ops.alibi.alibi_backward`). These ops are layer 2 of the three
layers (:mod:`plsh_dist.ops.plsh`, :mod:`plsh_dist.ops.alibi`): they only dispatch.

Legend: B batch, T tokens, Hq query heads, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from plsh_dist.hashing import FixedBlocks, PositionalLSH
from plsh_dist.ops import alibi, plsh
from plsh_dist.ops.documents import backward_on_flat_row, layout_of_position_ids, on_flat_row
from plsh_dist.ops.merge import accum_dtype
from plsh_dist.ops.plsh_varlen import VarlenPerSample
from plsh_dist.splitmix import MASK64, hash_seed

NAMESPACE = "plsh_dist"


def _layout(positions, cu_seqlens, q, from_position_ids: bool):
    if from_position_ids:
        return layout_of_position_ids(positions, cu_seqlens, q.shape[0], q.shape[1])
    return positions, cu_seqlens


def _fake_forward(q: Tensor) -> tuple[Tensor, Tensor]:
    B, T, Hq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        q.new_empty((B, Hq, T), dtype=accum_dtype(q.dtype))


def _fake_backward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _register_autograd(op, backward_op) -> None:
    """``op(q, k, v, *params) -> (out, lse)``'s autograd: saves q, k, v, out, lse (the only activations
    saved) and keeps the params (small host tensors among them: positions, offsets, seed, sigma or
    slopes); backward is ``backward_op(dout, q, k, v, out, lse, *params) -> (dq, dk, dv)``."""

    def setup_context(ctx, inputs, output):
        q, k, v, *params = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.params = params

    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward_op(dout.contiguous(), q, k, v, out, lse, *ctx.params)
        return (dq, dk, dv) + (None,) * len(ctx.params)

    op.register_autograd(backward, setup_context=setup_context)


# --- positional LSH and fixed blocks --------------------------------------------------------


def _hash(sigma: Tensor, num_samples: int, seed: Tensor, sampler: str, fixed: bool) -> PositionalLSH:
    return FixedBlocks(sigma) if fixed else PositionalLSH(sigma, num_samples, int(seed), sampler)


@torch.library.custom_op(f"{NAMESPACE}::block_attention", mutates_args=())
def block_attention(q: Tensor, k: Tensor, v: Tensor, positions: Tensor | None, cu_seqlens: Tensor | None,
                    seed: Tensor, sigma: Tensor, num_samples: int, sampler: str, fixed: bool, causal: bool,
                    softmax_scale: float | None, backend: str, method: str,
                    from_position_ids: bool) -> tuple[Tensor, Tensor]:
    """PLSH (``fixed``: fixed blocks) attention: ``(out, lse)`` of :func:`plsh_dist.ops.plsh_attention`."""
    lsh = _hash(sigma, num_samples, seed, sampler, fixed)
    positions, cu_seqlens = _layout(positions, cu_seqlens, q, from_position_ids)
    pos, scale, strategy, docs = plsh.check_block_attention(q, k, v, lsh, positions, softmax_scale, backend, method,
                                                            cu_seqlens)
    if docs is None:
        out, lse, _ = strategy.forward(q, k, v, lsh, pos, causal=causal, scale=scale)
    else:  # documents: one flat row of B * T tokens whose row boundaries are document boundaries
        out, lse, _ = on_flat_row(strategy.forward, q, k, v, lsh, pos, causal=causal, scale=scale, docs=docs)
    return out.contiguous(), lse.contiguous()


@block_attention.register_fake
def _(q, k, v, *_params):
    return _fake_forward(q)


@torch.library.custom_op(f"{NAMESPACE}::block_attention_backward", mutates_args=())
def block_attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             positions: Tensor | None, cu_seqlens: Tensor | None, seed: Tensor, sigma: Tensor,
                             num_samples: int, sampler: str, fixed: bool, causal: bool,
                             softmax_scale: float | None, backend: str, method: str,
                             from_position_ids: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`block_attention`: the hash and the layouts rebuilt, the strategy's backward
    with the merged ``out`` / ``lse``."""
    lsh = _hash(sigma, num_samples, seed, sampler, fixed)
    positions, cu_seqlens = _layout(positions, cu_seqlens, q, from_position_ids)
    pos, scale, strategy, docs = plsh.check_block_attention(q, k, v, lsh, positions, softmax_scale, backend, method,
                                                            cu_seqlens)
    kw = dict(causal=causal, scale=scale)
    if isinstance(strategy, VarlenPerSample):
        # its backward takes the forward's varlen calls (host integers), which an op cannot keep: they are
        # remade by running the forward again (compiled CUDA per-sample only; eager keeps them)
        kw["saved"] = (strategy.forward(q, k, v, lsh, pos, **kw) if docs is None else
                       on_flat_row(strategy.forward, q, k, v, lsh, pos, docs=docs, **kw))[2]
    if docs is None:
        grads = strategy.backward(dout, q, k, v, out, lse, lsh, pos, **kw)
    else:
        grads = backward_on_flat_row(strategy.backward, dout, q, k, v, out, lse, lsh, pos, docs=docs, **kw)
    return tuple(g.contiguous() for g in grads)


@block_attention_backward.register_fake
def _(dout, q, k, v, *_params):
    return _fake_backward(q, k, v)


_register_autograd(block_attention, block_attention_backward)


# --- exact, windowed and truncated ALiBi (and causal attention with lse or documents) -------


def _alibi_call(q, k, v, positions, cu_seqlens, slopes, window, softmax_scale, chunk_size, from_position_ids):
    """The arguments of :func:`~plsh_dist.ops.alibi.alibi_forward` / ``alibi_backward``:
    ``(q_pos, k_pos, slopes, dict(window, scale, chunk, docs))`` and whether documents flatten the call."""
    positions, cu_seqlens = _layout(positions, cu_seqlens, q, from_position_ids)
    win = None if not window else window[0] if len(window) == 1 else tuple(window)
    if cu_seqlens is None:
        slopes, pos, scale, win = alibi.check_alibi_attention(q, k, v, slopes, positions, win, softmax_scale,
                                                              chunk_size)
        return pos, slopes, dict(window=win, scale=scale, chunk=chunk_size), False
    pos, slopes, scale, win, chunk, doc_ids = alibi.alibi_documents_call(q, k, v, slopes, positions, win,
                                                                          softmax_scale, chunk_size, cu_seqlens)
    return pos, slopes, dict(window=win, scale=scale, chunk=chunk, docs=(doc_ids, doc_ids)), True


@torch.library.custom_op(f"{NAMESPACE}::alibi_attention", mutates_args=())
def alibi_attention(q: Tensor, k: Tensor, v: Tensor, positions: Tensor | None, cu_seqlens: Tensor | None,
                    slopes: Tensor, window: list[int], causal: bool, softmax_scale: float | None,
                    chunk_size: int | None, from_position_ids: bool) -> tuple[Tensor, Tensor]:
    """Exact ALiBi (``window``: [] none, [w] one for every head, or one per head): ``(out, lse)`` of
    :func:`plsh_dist.ops.alibi_attention` on the chunked (non-Triton) path."""
    pos, slopes, kw, flat = _alibi_call(q, k, v, positions, cu_seqlens, slopes, window, softmax_scale, chunk_size,
                                        from_position_ids)
    run = on_flat_row if flat else (lambda fn, *a, **k: fn(*a, **k))
    out, lse = run(alibi.alibi_forward, q, k, v, pos, pos, slopes, causal=causal, **kw)
    return out.contiguous(), lse.contiguous()


@alibi_attention.register_fake
def _(q, k, v, *_params):
    return _fake_forward(q)


@torch.library.custom_op(f"{NAMESPACE}::alibi_attention_backward", mutates_args=())
def alibi_attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             positions: Tensor | None, cu_seqlens: Tensor | None, slopes: Tensor,
                             window: list[int], causal: bool, softmax_scale: float | None, chunk_size: int | None,
                             from_position_ids: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`alibi_attention`, recomputing each query chunk."""
    pos, slopes, kw, flat = _alibi_call(q, k, v, positions, cu_seqlens, slopes, window, softmax_scale, chunk_size,
                                        from_position_ids)
    run = backward_on_flat_row if flat else (lambda fn, *a, **k: fn(*a, **k))
    grads = run(alibi.alibi_backward, dout, q, k, v, out, lse, pos, pos, slopes, causal=causal, **kw)
    return tuple(g.contiguous() for g in grads)


@alibi_attention_backward.register_fake
def _(dout, q, k, v, *_params):
    return _fake_backward(q, k, v)


_register_autograd(alibi_attention, alibi_attention_backward)


# --- seeds ------------------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::layer_seed", mutates_args=())
def layer_seed(steps: Tensor, run_seed: int, layer: Tensor) -> Tensor:
    """``hash_seed(run_seed, step, micro_step, layer)`` as an int64 scalar tensor (CPU), from ``steps``
    = LongTensor[2] ``(step, micro_step)`` and ``layer`` (int64 scalar; tensors, so a compiled graph
    serves every step and layer; ``run_seed`` taken mod 2^64, as ``hash_seed`` does)."""
    step, micro_step = steps.tolist()
    return torch.tensor(hash_seed(run_seed & MASK64, step, micro_step, int(layer)), dtype=torch.int64)


@layer_seed.register_fake
def _(steps, run_seed, layer):
    return torch.empty((), dtype=torch.int64)


def signed64(x: int) -> int:
    """An int taken mod 2^64 as a signed int64 (what an op's ``int`` argument holds)."""
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x
