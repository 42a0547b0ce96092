"""Positional LSH attention: s short block attentions merged by log-sum-exp
(``method="per_sample"``), or the same estimator as one attention with the
bias ``log c_ij`` (``method="onepass"``, :mod:`plsh_dist.ops.plsh_onepass`).

Three layers, as flash-attention's interface:

1. ``plsh_forward`` / ``plsh_backward``: pure functions over one process's
   tokens (sequence parallelism, :mod:`plsh_dist.distributed.sp`, calls them
   on its chunk plus a halo);
2. ``PLSHAttentionFunction``: saves q, k, v, out, lse only (not per sample)
   and dispatches;
3. ``plsh_attention`` / ``fixed_blocks_attention``: the public functions.

Single process only: nothing here communicates.

Legend: B batch, T tokens, Hq query heads, Hkv key/value heads, D head dim,
s samples; ``g = Hq // Hkv`` query heads per key/value head.
"""

from __future__ import annotations

import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH
from plsh_dist.ops.backends import Impl, resolve_backend, resolve_method
from plsh_dist.ops.block_layout import block_layout
from plsh_dist.ops.documents import Documents, flat_documents, flatten_rows, unflatten_lse, unflatten_rows
from plsh_dist.ops.gqa import repeat_kv, sum_kv_repeats
from plsh_dist.ops.merge import accum_dtype, merge_into
from plsh_dist.ops.padded_blocks import block_bwd, block_fwd
from plsh_dist.ops.plsh_onepass import onepass_backward, onepass_forward
from plsh_dist.ops.plsh_varlen import varlen_plsh_backward, varlen_plsh_forward
from plsh_dist.ops.varlen_plan import plan_samples
from plsh_dist.ops.validation import check_positions, check_qkv, softmax_scale_for

__all__ = [
    "plsh_attention", "fixed_blocks_attention", "plsh_forward", "plsh_backward", "check_block_attention",
    "PLSHAttentionFunction",
]


def _dense_kernel(impl: Impl):
    """The dense kernel of the one-pass path: the padded path's choice, else per call (varlen kernels
    take no bias)."""
    return None if impl.varlen else impl.kernel


def _layouts(lsh: PositionalLSH, positions: torch.Tensor, device: torch.device, docs: Documents | None):
    """Yield (sample, hash head, layout) for every (t, h); layouts are cheap, never stored."""
    buckets = lsh.buckets(positions)  # (s, H, n) on CPU
    doc_starts = None if docs is None else docs.start_mask
    for t in range(buckets.shape[0]):
        for h in range(buckets.shape[1]):
            yield t, h, block_layout(buckets[t, h], device, doc_starts)


def _head_major(x_BTHD: torch.Tensor) -> torch.Tensor:
    """(B, T, H, D) -> contiguous (H, B, T, D): each head's rows become one dense
    array, so the per-(sample, head) gathers below read contiguous memory."""
    return x_BTHD.permute(2, 0, 1, 3).contiguous()


def plsh_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lsh: PositionalLSH,
    positions: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    impl: Impl,
    plan=None,
    docs: Documents | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merged block attention over all samples.

    Args:
        q: (B, T, Hq, D); k, v: (B, T, Hkv, D).
        lsh: hash with 1 or Hq heads; positions: CPU LongTensor[T], increasing.
        impl: from :func:`~plsh_dist.ops.backends.resolve_backend` and ``resolve_method``
            (``impl.onepass`` selects the one-pass form).
        plan: varlen implementations only, :func:`~plsh_dist.ops.varlen_plan.plan_samples`'s
            (computed when None).
        docs: documents of a batch-1 call (:class:`~plsh_dist.ops.documents.Documents`):
            every sample's blocks are also cut where a document starts.
    Returns:
        out (B, T, Hq, D) in q's dtype, lse (B, Hq, T) in fp32 (fp64 for fp64).
    """
    if impl.onepass:  # one attention with the bias log c_ij
        return onepass_forward(q, k, v, lsh, positions, causal=causal, scale=scale, kernel=_dense_kernel(impl),
                               docs=docs)
    if impl.varlen:  # CUDA: one varlen call per sample over all heads
        return varlen_plsh_forward(q, k, v, lsh, positions, causal=causal, scale=scale, impl=impl, plan=plan,
                                   docs=docs)
    Hq, Hkv = q.shape[2], k.shape[2]
    g = Hq // Hkv
    if lsh.num_heads == 1:  # one hash for every head: one call per sample serves all heads
        k_all, v_all = repeat_kv(k, g), repeat_kv(v, g)
        out, lse = None, None
        for _, _, layout in _layouts(lsh, positions, q.device, docs):
            out, lse = merge_into(out, lse, *block_fwd(q, k_all, v_all, layout, causal=causal, scale=scale,
                                                       kernel=impl.kernel))
        return out.to(q.dtype), lse

    q_h, k_h, v_h = _head_major(q), _head_major(k), _head_major(v)  # (H, B, T, D)
    out = [None] * Hq
    lse = [None] * Hq
    for _, h, layout in _layouts(lsh, positions, q.device, docs):
        o, l = block_fwd(
            q_h[h, :, :, None], k_h[h // g, :, :, None], v_h[h // g, :, :, None], layout,
            causal=causal, scale=scale, kernel=impl.kernel,
        )  # (B, T, 1, D), (B, 1, T): merge_into's layout with one head
        out[h], lse[h] = merge_into(out[h], lse[h], o, l)
    return torch.cat(out, dim=2).to(q.dtype), torch.cat(lse, dim=1)


def plsh_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    lsh: PositionalLSH,
    positions: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    impl: Impl,
    plan=None,
    docs: Documents | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`plsh_forward`: every sample's block backward with the
    merged ``out`` and ``lse``, summed (DESIGN.md section 2).

    Returns dq (B, T, Hq, D), dk, dv (B, T, Hkv, D) in the inputs' dtype.
    """
    if impl.onepass:
        return onepass_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale,
                                kernel=_dense_kernel(impl), docs=docs)
    if impl.varlen:
        return varlen_plsh_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale, impl=impl,
                                    plan=plan, docs=docs)
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    g = Hq // Hkv
    acc = accum_dtype(q.dtype)
    if lsh.num_heads == 1:
        k_all, v_all = repeat_kv(k, g), repeat_kv(v, g)
        dq = torch.zeros(B, T, Hq, D, dtype=acc, device=q.device)
        dk = torch.zeros(k_all.shape, dtype=acc, device=q.device)
        dv = torch.zeros(k_all.shape, dtype=acc, device=q.device)
        for _, _, layout in _layouts(lsh, positions, q.device, docs):
            grads = block_bwd(dout, q, k_all, v_all, out, lse, layout, causal=causal, scale=scale, kernel=impl.kernel)
            for acc_grad, grad in zip((dq, dk, dv), grads):
                acc_grad += grad
        dk, dv = sum_kv_repeats(dk, g), sum_kv_repeats(dv, g)  # kv heads were repeated for the padded kernels
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    q_h, k_h, v_h, out_h, dout_h = (_head_major(x) for x in (q, k, v, out, dout))
    lse_h = lse.transpose(0, 1).contiguous()  # (Hq, B, T)
    dq = torch.zeros(Hq, B, T, D, dtype=acc, device=q.device)
    dk = torch.zeros(Hkv, B, T, D, dtype=acc, device=q.device)
    dv = torch.zeros(Hkv, B, T, D, dtype=acc, device=q.device)
    for _, h, layout in _layouts(lsh, positions, q.device, docs):
        kv = h // g
        dq_h, dk_h, dv_h = block_bwd(
            dout_h[h, :, :, None], q_h[h, :, :, None], k_h[kv, :, :, None], v_h[kv, :, :, None],
            out_h[h, :, :, None], lse_h[h, :, None], layout, causal=causal, scale=scale, kernel=impl.kernel,
        )
        dq[h] += dq_h[:, :, 0]
        dk[kv] += dk_h[:, :, 0]
        dv[kv] += dv_h[:, :, 0]
    back = lambda x, like: x.permute(1, 2, 0, 3).to(like.dtype)  # (H, B, T, D) -> (B, T, H, D)
    return back(dq, q), back(dk, k), back(dv, v)


# ---------------------------------------------------------------------------
# Layer 2: autograd
# ---------------------------------------------------------------------------


class PLSHAttentionFunction(torch.autograd.Function):
    """Saves q, k, v, out, lse only: activation memory does not grow with s.

    Returns ``(out, lse)``; ``lse`` is not differentiable (as flash-attn's).
    """

    @staticmethod
    def forward(ctx, q, k, v, lsh, positions, causal, scale, impl, docs=None):
        # varlen: plan the calls once (the op's one host sync); the backward reuses it
        plan = plan_samples(lsh, positions, q.shape[0], q.device, docs=docs) if impl.varlen and not impl.onepass \
            else None
        out, lse = plsh_forward(q, k, v, lsh, positions, causal=causal, scale=scale, impl=impl, plan=plan, docs=docs)
        ctx.mark_non_differentiable(lse)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.lsh, ctx.positions, ctx.causal, ctx.scale, ctx.impl = lsh, positions, causal, scale, impl
            ctx.plan, ctx.docs = plan, docs
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = plsh_backward(
            dout.contiguous(), q, k, v, out, lse, ctx.lsh, ctx.positions,
            causal=ctx.causal, scale=ctx.scale, impl=ctx.impl, plan=ctx.plan, docs=ctx.docs,
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
        backend: one of :data:`plsh_dist.ops.backends.BACKENDS`: "auto"
            (flash-attn varlen when available, else torch), "torch", "math"
            (explicit matmuls, any device) or "flash_attn".
        sampler: "iid" or "stratified" (see :class:`PositionalLSH`).
        method: "per_sample" (s block attentions merged by log-sum-exp),
            "onepass" (one attention with the bias ``log c_ij``, ``c_ij`` the
            number of samples in which i and j share a block: cost grows like
            log s) or "auto" (:func:`plsh_dist.ops.backends.resolve_method`).
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
        chunks: :class:`plsh_dist.distributed.sp.SequenceParallelAttention`.
    """
    lsh = PositionalLSH(sigma, num_samples, seed, sampler)
    return _block_attention(q, k, v, lsh, positions, causal, softmax_scale, backend, method, return_lse, cu_seqlens)


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
    return _block_attention(q, k, v, FixedBlocks(sigma), positions, causal, softmax_scale, backend, method,
                            return_lse, cu_seqlens)


def check_block_attention(q, k, v, lsh: PositionalLSH, positions, softmax_scale, backend, method="auto",
                          cu_seqlens=None):
    """Validate the arguments of a block attention; ValueErrors name the argument.

    Returns ``(positions, scale, impl, docs)``: without ``cu_seqlens`` CPU
    LongTensor[T] and ``docs = None``; with it the flat row's LongTensor[B * T]
    and its :class:`~plsh_dist.ops.documents.Documents`; then float, :class:`Impl`.
    """
    check_qkv(q, k, v)
    if lsh.num_heads not in (1, q.shape[2]):
        raise ValueError(
            f"sigma must be a float or a Tensor[Hq] with Hq={q.shape[2]} entries, got {lsh.num_heads} entries"
        )
    if cu_seqlens is None:
        pos, docs = check_positions(positions, q.shape[1], q.device), None
    else:
        docs = flat_documents(positions, cu_seqlens, q.shape[0], q.shape[1])
        pos = docs.positions
    impl = resolve_method(method, resolve_backend(backend, q.device, q.dtype), lsh.num_samples)
    return pos, softmax_scale_for(q, softmax_scale), impl, docs


def _block_attention(q, k, v, lsh: PositionalLSH, positions, causal, softmax_scale, backend, method, return_lse,
                     cu_seqlens):
    pos, scale, impl, docs = check_block_attention(q, k, v, lsh, positions, softmax_scale, backend, method, cu_seqlens)
    if docs is None:
        out, lse = PLSHAttentionFunction.apply(q, k, v, lsh, pos, causal, scale, impl)
        return (out, lse) if return_lse else out
    # documents: one flat row of B * T tokens whose row boundaries are document boundaries
    B = q.shape[0]
    out, lse = PLSHAttentionFunction.apply(*(flatten_rows(x) for x in (q, k, v)), lsh, pos, causal, scale, impl,
                                           docs)
    out = unflatten_rows(out, B)
    return (out, unflatten_lse(lse, B)) if return_lse else out
