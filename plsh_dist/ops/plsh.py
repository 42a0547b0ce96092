"""Positional LSH attention: s short block attentions merged by log-sum-exp
(``method="per_sample"``), or the same estimator as one attention with the
bias ``log c_ij`` (``method="onepass"``, :mod:`plsh_dist.ops.cpu.onepass`).

Three layers, as flash-attention's interface:

1. pure forward / backward functions, one file per strategy
   (:mod:`plsh_dist.ops.backends` chooses the strategy, and says which file holds
   which); sequence parallelism (:mod:`plsh_dist.distributed.sp`) calls the
   same strategy on its chunk plus a halo;
2. the custom op ``plsh_dist::block_attention`` and its autograd formula
   (:mod:`plsh_dist.ops.custom_ops`): saves q, k, v, out, lse only (not per sample),
   rebuilds the hash from its seed and looks up the strategy its caller chose
   (by name: its backward does not choose again), so
   ``torch.compile(fullgraph=True)`` keeps one graph. Eager, a strategy whose
   backward reuses what its forward saved (``keeps_host_state``: the CUDA varlen
   calls, the fused kernel's band tables) runs through ``PLSHAttentionFunction``
   instead, which keeps that too;
3. ``plsh_attention`` / ``fixed_blocks_attention``: the public functions.

Single process only: nothing here communicates.

Legend: B batch, T tokens, Hq query heads, Hkv key/value heads, D head dim, s samples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from plsh_dist.hashing import FixedBlocks, PositionalLSH, get_sampler
from plsh_dist.ops.backends import choose_strategy, chosen_name, strategy_name, strategy_named
from plsh_dist.ops.custom_ops import NAMESPACE, fake_backward, fake_forward, register_autograd
from plsh_dist.ops.documents import BatchRows, Documents, flat_documents
from plsh_dist.ops.head_groups import head_groups
from plsh_dist.ops.layout import device_layout, host_layout
from plsh_dist.ops.input_checks import check_positions, check_qkv, softmax_scale_for


# ---------------------------------------------------------------------------
# Layer 2: autograd
# ---------------------------------------------------------------------------


class PLSHAttentionFunction(torch.autograd.Function):
    """Saves q, k, v, out, lse only: activation memory does not grow with s.

    Returns ``(out, lse)``; ``lse`` is not differentiable (as flash-attn's).
    """

    @staticmethod
    def forward(ctx, q, k, v, lsh, positions, causal, scale, strategy, docs: Documents | None = None):
        """``strategy``: from :func:`~plsh_dist.ops.backends.choose_strategy`; what it saved is kept for the
        backward."""
        out, lse, saved = strategy.forward(q, k, v, lsh, positions, causal=causal, scale=scale, docs=docs)
        ctx.mark_non_differentiable(lse)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.lsh, ctx.positions, ctx.causal, ctx.scale, ctx.strategy = lsh, positions, causal, scale, strategy
            ctx.saved, ctx.docs = saved, docs
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.strategy.backward(
            dout.contiguous(), q, k, v, out, lse, ctx.lsh, ctx.positions,
            causal=ctx.causal, scale=ctx.scale, docs=ctx.docs, saved=ctx.saved,
        )
        return dq, dk, dv, None, None, None, None, None, None


# ---------------------------------------------------------------------------
# Layer 3: public functions
# ---------------------------------------------------------------------------


def plsh_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sigma,
    num_samples: int,
    seed: int,
    positions: torch.Tensor | None = None,
    causal: bool = True,
    softmax_scale: float | None = None,
    backend: str = "auto",
    sampler: str = "iid",
    method: str = "auto",
    return_lse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
):
    """Positional LSH approximation of ALiBi attention (one process).

    ``out_i = sum_t sum_{j in B_t(i), j<=i} E_ij v_j / sum_t sum_{j in B_t(i), j<=i} E_ij``
    with ``E_ij = exp(q_i . k_j * softmax_scale)`` and ``B_t(i)`` the block of
    position ``i`` in sample ``t`` of ``PositionalLSH(sigma, num_samples, seed)``
    (exactly its ``buckets(positions)``). Its expectation over hashes weights
    logits as ALiBi does: ``E[M~_ij] = exp(-|p_i - p_j| / sigma_h)``.

    Args:
        q: (B, T, Hq, D). k, v: (B, T, Hkv, D), Hq % Hkv == 0 (GQA; hashing is
            per query head).
        sigma: float (one hash shared by all heads) or Tensor[Hq] (one hash
            per head; ALiBi's is ``alibi_slopes(Hq).reciprocal()``).
        num_samples: s >= 1 masks, merged by log-sum-exp.
        seed: int; masks are a pure function of (seed, sample, head, position).
        positions: LongTensor[T] of increasing absolute positions (default
            arange(T)).
        causal: mask future tokens inside each block.
        softmax_scale: default 1/sqrt(D).
        backend: one of :data:`plsh_dist.ops.backends.BACKENDS`; "auto" takes
            the first row of the table of :mod:`plsh_dist.ops.backends` that
            applies (where each backend runs is there too).
        sampler: "iid" or "stratified" (see :class:`PositionalLSH`).
        method: "per_sample" (s block attentions merged by log-sum-exp),
            "onepass" (one attention with the bias ``log c_ij``, ``c_ij`` the
            number of samples in which i and j share a block: cost grows like
            log s) or "auto" (the table of :mod:`plsh_dist.ops.backends`).
            Same estimator, same blocks: equal up to rounding.
        return_lse: also return the log-sum-exp of the merged attention.
        cu_seqlens: packed documents, int32/int64 (num_docs + 1,) offsets over the
            flattened (B, T) batch (flash-attn's convention: 0, ..., B * T, every
            row boundary included; :mod:`plsh_dist.ops.documents`). Every
            sample's blocks are cut at the document starts too, so no token
            attends across a document; the expectation is document-masked
            ALiBi. ``positions`` may then be (B, T) and restart at each
            document start. Rows may have different layouts.
    Returns:
        out (B, T, Hq, D) in q's dtype; with ``return_lse`` also lse (B, Hq, T)
        in fp32 (fp64 for fp64 inputs), not differentiable. Sequence-parallel
        chunks: :func:`plsh_dist.distributed.sp.plsh_attention`.
    """
    for name, value in (("num_samples", num_samples), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.Tensor)):
            raise ValueError(f"{name} must be an int, got {value!r}")
    get_sampler(sampler)
    return block_attention(q, k, v, PositionalLSH(sigma, num_samples, seed, sampler), positions, causal, softmax_scale,
                           backend, method, return_lse, cu_seqlens)


def fixed_blocks_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sigma,
    positions: torch.Tensor | None = None,
    causal: bool = True,
    softmax_scale: float | None = None,
    backend: str = "auto",
    method: str = "auto",
    return_lse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
):
    """The paper's fixed-blocks baseline: blocks of pitch ``2 * sigma_h``
    aligned at position 0, one sample. Arguments as :func:`plsh_attention`."""
    return block_attention(q, k, v, FixedBlocks(sigma), positions, causal, softmax_scale, backend, method, return_lse,
                           cu_seqlens)


def check_block_attention(q, k, v, lsh: PositionalLSH, positions, softmax_scale, cu_seqlens=None):
    """Validate the arguments of a block attention; ValueErrors name the argument.

    Returns ``(positions, scale, docs)``: without ``cu_seqlens`` CPU
    LongTensor[T] and ``docs = None``; with it the flat row's LongTensor[B * T]
    and its :class:`~plsh_dist.ops.documents.Documents`; the scale a float.
    (The strategy is the caller's: :func:`~plsh_dist.ops.backends.choose_strategy`, once per call.)
    """
    check_qkv(q, k, v)
    head_groups(lsh, q.shape[2], k.shape[2])  # checks sigma's length
    if cu_seqlens is None:
        pos, docs = check_positions(positions, q.shape[1], q.device), None
    else:
        docs = flat_documents(positions, cu_seqlens, q.shape[0], q.shape[1])
        pos = docs.positions
    return pos, softmax_scale_for(q, softmax_scale), docs


def block_attention(q, k, v, lsh: PositionalLSH, positions, causal, softmax_scale, backend, method, return_lse,
                    cu_seqlens, from_position_ids: bool = False):
    """The blocks of hash ``lsh`` (PLSH, or :class:`~plsh_dist.hashing.FixedBlocks`), checked arguments: what
    :func:`plsh_attention` and :func:`fixed_blocks_attention` compute, and what the PLSH biases
    (:mod:`plsh_dist.biases`) call. The strategy is chosen here, once. Eagerly, a strategy that keeps host
    state from its forward for its backward, or answers without gradients, runs through
    :class:`PLSHAttentionFunction` (or its ``attend``); every other call is the custom op, given the
    strategy by name. Compiled, every strategy runs in the op (whose backward rebuilds what it needs);
    ``from_position_ids`` (compiled only): ``positions`` are the raw ``position_ids``, laid out in the op."""
    if torch.compiler.is_compiling():
        name = chosen_name(backend, method, q.device, q.dtype, lsh.num_samples)
    else:
        needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        strategy = choose_strategy(backend, method, q.device, q.dtype, lsh.num_samples,
                                   out_only=not (return_lse or needs_grad))
        if strategy.keeps_host_state or strategy.output_only:
            return _eager_call(q, k, v, lsh, positions, causal, softmax_scale, strategy, return_lse, cu_seqlens)
        name = strategy_name(strategy)
    out, lse = block_attention_op(q, k, v, positions, cu_seqlens, *op_args(lsh), causal, softmax_scale, name,
                                  from_position_ids)
    return (out, lse) if return_lse else out


def _eager_call(q, k, v, lsh, positions, causal, softmax_scale, strategy, return_lse, cu_seqlens):
    """:func:`block_attention` through :class:`PLSHAttentionFunction`, or the output-only ``attend``."""
    pos, scale, docs = check_block_attention(q, k, v, lsh, positions, softmax_scale, cu_seqlens)
    rows = BatchRows.of(q, docs is not None)  # documents: one flat row whose row boundaries are theirs
    if strategy.output_only:  # the table gives it only to calls that need no gradient and no lse
        out = strategy.attend(*rows.inputs(q, k, v), lsh, pos, causal=causal, scale=scale, docs=docs)
        return rows.output(out)
    out, lse = rows.outputs(*PLSHAttentionFunction.apply(*rows.inputs(q, k, v), lsh, pos, causal, scale, strategy,
                                                         docs))
    return (out, lse) if return_lse else out


# --- the custom op (layer 2; registrations shared with ALiBi's: plsh_dist.ops.custom_ops) --------------------------------------------------------


def op_args(lsh: PositionalLSH) -> tuple[Tensor, Tensor, int, str, bool]:
    """A hash as the custom ops' schema takes it (tensors and scalars): ``(seed, sigma, num_samples, sampler,
    fixed)``, the seed an int64 scalar tensor and sigma a Tensor[H] as given (unread). :func:`op_hash` is the
    way back, inside the op."""
    seed, sigma = lsh.given
    return lsh.seed_tensor if not isinstance(seed, Tensor) else seed, sigma, lsh.num_samples, lsh.sampler, lsh.fixed


def op_hash(seed: Tensor, sigma: Tensor, num_samples: int, sampler: str, fixed: bool) -> PositionalLSH:
    """The hash :func:`op_args` gave an op: the seed stays a tensor (read on the host only by a strategy
    that draws there)."""
    return FixedBlocks(sigma) if fixed else PositionalLSH(sigma, num_samples, seed, sampler)


def _op_call(q, k, v, lsh, positions, cu_seqlens, softmax_scale, strategy, from_position_ids):
    """The ops' ``(positions, scale, docs)``. Raw ``position_ids`` (and packed offsets) on a device, for a
    strategy that builds its layout there (``device_positions``: the fused kernel), stay there
    (:func:`~plsh_dist.ops.layout.device_layout`; ``docs`` is then the documents' layout): that call
    reads nothing back to the host. Otherwise the host lays them out (:func:`check_block_attention`)."""
    on_device = device_layout(positions, cu_seqlens, q, from_position_ids) if strategy.device_positions else None
    if on_device is not None:
        check_qkv(q, k, v)
        head_groups(lsh, q.shape[2], k.shape[2])
        pos, docs = on_device
        return pos, softmax_scale_for(q, softmax_scale), docs
    positions, cu_seqlens = host_layout(positions, cu_seqlens, q, from_position_ids)
    return check_block_attention(q, k, v, lsh, positions, softmax_scale, cu_seqlens)


@torch.library.custom_op(f"{NAMESPACE}::block_attention", mutates_args=())
def block_attention_op(q: Tensor, k: Tensor, v: Tensor, positions: Tensor | None, cu_seqlens: Tensor | None,
                    seed: Tensor, sigma: Tensor, num_samples: int, sampler: str, fixed: bool, causal: bool,
                    softmax_scale: float | None, strategy: str, from_position_ids: bool) -> tuple[Tensor, Tensor]:
    """PLSH (``fixed``: fixed blocks) attention: ``(out, lse)`` of :func:`plsh_dist.ops.plsh_attention`, on the
    strategy named ``strategy`` (:func:`~plsh_dist.ops.backends.strategy_name` of the caller's choice)."""
    lsh = op_hash(seed, sigma, num_samples, sampler, fixed)
    strategy = strategy_named(strategy)
    pos, scale, docs = _op_call(q, k, v, lsh, positions, cu_seqlens, softmax_scale, strategy, from_position_ids)
    rows = BatchRows.of(q, docs is not None)  # documents: one flat row whose row boundaries are theirs
    out, lse, _ = strategy.forward(*rows.inputs(q, k, v), lsh, pos, causal=causal, scale=scale, docs=docs)
    out, lse = rows.outputs(out, lse)
    return out.contiguous(), lse.contiguous()


@block_attention_op.register_fake
def _(q, k, v, *_params):
    return fake_forward(q)


@torch.library.custom_op(f"{NAMESPACE}::block_attention_backward", mutates_args=())
def block_attention_op_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             positions: Tensor | None, cu_seqlens: Tensor | None, seed: Tensor, sigma: Tensor,
                             num_samples: int, sampler: str, fixed: bool, causal: bool,
                             softmax_scale: float | None, strategy: str,
                             from_position_ids: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`block_attention_op`: the hash and the layouts rebuilt, the forward's strategy
    looked up by its name (not chosen again), its backward with the merged ``out`` / ``lse``."""
    lsh = op_hash(seed, sigma, num_samples, sampler, fixed)
    strategy = strategy_named(strategy)
    pos, scale, docs = _op_call(q, k, v, lsh, positions, cu_seqlens, softmax_scale, strategy, from_position_ids)
    rows = BatchRows.of(q, docs is not None)
    kw = dict(causal=causal, scale=scale, docs=docs)
    if strategy.backward_takes_saved:  # compiled CUDA per-sample only; eager keeps them
        kw["saved"] = strategy.forward(*rows.inputs(q, k, v), lsh, pos, **kw)[2]
    grads = strategy.backward(*rows.inputs(dout, q, k, v, out), rows.lse_input(lse), lsh, pos, **kw)
    return tuple(g.contiguous() for g in rows.grads(grads))


@block_attention_op_backward.register_fake
def _(dout, q, k, v, *_params):
    return fake_backward(q, k, v)


register_autograd(block_attention_op, block_attention_op_backward)
