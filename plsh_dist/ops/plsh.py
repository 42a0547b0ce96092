"""Positional LSH attention: s short block attentions merged by log-sum-exp.

Three layers, as flash-attention's interface:

1. ``plsh_forward`` / ``plsh_backward``: pure functions over one process's
   tokens (sequence parallelism calls them on its chunk plus a halo);
2. ``PLSHAttentionFunction``: saves q, k, v, out, lse only (not per sample)
   and dispatches;
3. ``plsh_attention`` / ``fixed_blocks_attention``: the public functions.

Legend: B batch, T tokens, Hq query heads, Hkv key/value heads, D head dim,
s samples; ``g = Hq // Hkv`` query heads per key/value head.
"""

from __future__ import annotations


import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH
from plsh_dist.ops import backend_torch, backend_varlen_cuda
from plsh_dist.ops.blocks import BlockLayout
from plsh_dist.ops.merge import accum_dtype, merge_into
from plsh_dist.ops.plsh_varlen import varlen_plsh_backward, varlen_plsh_forward
from plsh_dist.ops.varlen_plan import plan_samples
from plsh_dist.ops.validation import check_positions, check_qkv, softmax_scale_for

__all__ = ["plsh_attention", "fixed_blocks_attention", "plsh_forward", "plsh_backward", "resolve_backend"]

BACKENDS = ("auto", "torch", "math", "flash_attn")


# ---------------------------------------------------------------------------
# Backend choice
# ---------------------------------------------------------------------------


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """Map the user's ``backend`` to an implementation.

    Returns one of ``"padded"`` (padded blocks, aten CPU kernel or math),
    ``"padded_math"`` (padded blocks, explicit matmuls: any device/dtype),
    ``"varlen_flash_attn"`` or ``"varlen_aten"`` (CUDA varlen, no padding).
    (``"varlen_reference"``, the varlen path on explicit matmuls, is for tests.)
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "math":
        return "padded_math"
    if backend == "flash_attn":
        if not backend_varlen_cuda.flash_attn_available(device, dtype):
            raise ValueError(
                "backend='flash_attn' needs CUDA tensors in fp16/bf16 and the flash-attn package "
                "(pip install 'plsh_dist[gpu]'); use backend='auto' to fall back to torch"
            )
        return "varlen_flash_attn"
    if backend == "auto" and backend_varlen_cuda.flash_attn_available(device, dtype):
        return "varlen_flash_attn"
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return "varlen_aten"
    return "padded"


def _layouts(lsh: PositionalLSH, positions: torch.Tensor, device: torch.device):
    """Yield (sample, hash head, BlockLayout) for every (t, h); layouts are cheap, never stored."""
    buckets = lsh.buckets(positions)  # (s, H, n) on CPU
    for t in range(buckets.shape[0]):
        for h in range(buckets.shape[1]):
            yield t, h, BlockLayout.from_buckets(buckets[t, h], device)


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
    impl: str,
    plan=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merged block attention over all samples.

    Args:
        q: (B, T, Hq, D); k, v: (B, T, Hkv, D).
        lsh: hash with 1 or Hq heads; positions: CPU LongTensor[T], increasing.
        plan: varlen implementations only, :func:`~plsh_dist.ops.varlen_plan.plan_samples`'s
            (computed when None).
    Returns:
        out (B, T, Hq, D) in q's dtype, lse (B, Hq, T) in fp32 (fp64 for fp64).
    """
    if impl.startswith("varlen"):  # CUDA: one varlen call per sample over all heads
        return varlen_plsh_forward(q, k, v, lsh, positions, causal=causal, scale=scale, impl=impl, plan=plan)
    Hq, Hkv = q.shape[2], k.shape[2]
    g = Hq // Hkv
    if lsh.num_heads == 1:  # one hash for every head: one call per sample serves all heads
        k_all, v_all = _expand_kv(k, g), _expand_kv(v, g)
        out, lse = None, None
        for _, _, layout in _layouts(lsh, positions, q.device):
            out, lse = merge_into(out, lse, *_block_fwd(q, k_all, v_all, layout, causal=causal, scale=scale, impl=impl))
        return out.to(q.dtype), lse

    q_h, k_h, v_h = _head_major(q), _head_major(k), _head_major(v)  # (H, B, T, D)
    out = [None] * Hq
    lse = [None] * Hq
    for _, h, layout in _layouts(lsh, positions, q.device):
        o, l = _block_fwd(
            q_h[h, :, :, None], k_h[h // g, :, :, None], v_h[h // g, :, :, None], layout,
            causal=causal, scale=scale, impl=impl,
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
    impl: str,
    plan=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`plsh_forward`: every sample's block backward with the
    merged ``out`` and ``lse``, summed (DESIGN.md section 2).

    Returns dq (B, T, Hq, D), dk, dv (B, T, Hkv, D) in the inputs' dtype.
    """
    if impl.startswith("varlen"):
        return varlen_plsh_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale, impl=impl,
                                    plan=plan)
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    g = Hq // Hkv
    acc = accum_dtype(q.dtype)
    if lsh.num_heads == 1:
        k_all, v_all = _expand_kv(k, g), _expand_kv(v, g)
        dq = torch.zeros(B, T, Hq, D, dtype=acc, device=q.device)
        dk = torch.zeros(k_all.shape, dtype=acc, device=q.device)
        dv = torch.zeros(k_all.shape, dtype=acc, device=q.device)
        for _, _, layout in _layouts(lsh, positions, q.device):
            grads = _block_bwd(dout, q, k_all, v_all, out, lse, layout, causal=causal, scale=scale, impl=impl)
            for acc_grad, grad in zip((dq, dk, dv), grads):
                acc_grad += grad
        if dk.shape[2] != Hkv:  # kv heads were repeated for the padded kernels: sum each group back
            dk, dv = (x.view(B, T, Hkv, g, D).sum(3) for x in (dk, dv))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    q_h, k_h, v_h, out_h, dout_h = (_head_major(x) for x in (q, k, v, out, dout))
    lse_h = lse.transpose(0, 1).contiguous()  # (Hq, B, T)
    dq = torch.zeros(Hq, B, T, D, dtype=acc, device=q.device)
    dk = torch.zeros(Hkv, B, T, D, dtype=acc, device=q.device)
    dv = torch.zeros(Hkv, B, T, D, dtype=acc, device=q.device)
    for _, h, layout in _layouts(lsh, positions, q.device):
        kv = h // g
        dq_h, dk_h, dv_h = _block_bwd(
            dout_h[h, :, :, None], q_h[h, :, :, None], k_h[kv, :, :, None], v_h[kv, :, :, None],
            out_h[h, :, :, None], lse_h[h, :, None], layout, causal=causal, scale=scale, impl=impl,
        )
        dq[h] += dq_h[:, :, 0]
        dk[kv] += dk_h[:, :, 0]
        dv[kv] += dv_h[:, :, 0]
    back = lambda x, like: x.permute(1, 2, 0, 3).to(like.dtype)  # (H, B, T, D) -> (B, T, H, D)
    return back(dq, q), back(dk, k), back(dv, v)


def _expand_kv(x_BTHD: torch.Tensor, groups: int) -> torch.Tensor:
    """Repeat kv heads for the padded kernels, which need Hq == Hkv."""
    return x_BTHD.repeat_interleave(groups, dim=2) if groups > 1 else x_BTHD


def _block_fwd(q, k, v, layout: BlockLayout, *, causal, scale, impl):
    kernel = "math" if impl == "padded_math" else None
    return backend_torch.block_fwd(q, k, v, layout, causal=causal, scale=scale, kernel=kernel)


def _block_bwd(dout, q, k, v, out, lse, layout: BlockLayout, *, causal, scale, impl):
    kernel = "math" if impl == "padded_math" else None
    return backend_torch.block_bwd(dout, q, k, v, out, lse, layout, causal=causal, scale=scale, kernel=kernel)


# ---------------------------------------------------------------------------
# Layer 2: autograd
# ---------------------------------------------------------------------------


class PLSHAttentionFunction(torch.autograd.Function):
    """Saves q, k, v, out, lse only: activation memory does not grow with s."""

    @staticmethod
    def forward(ctx, q, k, v, lsh, positions, causal, scale, impl):
        # varlen: plan the calls once (the op's one host sync); the backward reuses it
        plan = plan_samples(lsh, positions, q.shape[0], q.device) if impl.startswith("varlen") else None
        out, lse = plsh_forward(q, k, v, lsh, positions, causal=causal, scale=scale, impl=impl, plan=plan)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.lsh, ctx.positions, ctx.causal, ctx.scale, ctx.impl = lsh, positions, causal, scale, impl
            ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = plsh_backward(
            dout.contiguous(), q, k, v, out, lse, ctx.lsh, ctx.positions,
            causal=ctx.causal, scale=ctx.scale, impl=ctx.impl, plan=ctx.plan,
        )
        return dq, dk, dv, None, None, None, None, None


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
    sp_group=None,
) -> torch.Tensor:
    """Positional LSH approximation of ALiBi attention.

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
            arange(T)); under sequence parallelism the chunk's global positions.
        causal: mask future tokens inside each block.
        softmax_scale: default 1/sqrt(D).
        backend: "auto" (flash-attn varlen when available, else torch),
            "torch", "math" (explicit matmuls, any device) or "flash_attn".
        sampler: "iid" or "stratified" (see :class:`PositionalLSH`).
        sp_group: sequence-parallel process group (each rank passes its chunk).
    Returns:
        (B, T, Hq, D) in q's dtype.
    """
    lsh = PositionalLSH(sigma, num_samples, seed, sampler)
    return _block_attention(q, k, v, lsh, positions, causal, softmax_scale, backend, sp_group)


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
    sp_group=None,
) -> torch.Tensor:
    """The paper's fixed-blocks baseline: blocks of pitch ``2 * sigma_h``
    aligned at position 0, one sample. Arguments as :func:`plsh_attention`."""
    return _block_attention(q, k, v, FixedBlocks(sigma), positions, causal, softmax_scale, backend, sp_group)


def _block_attention(q, k, v, lsh: PositionalLSH, positions, causal, softmax_scale, backend, sp_group):
    check_qkv(q, k, v)
    if lsh.num_heads not in (1, q.shape[2]):
        raise ValueError(
            f"sigma must be a float or a Tensor[Hq] with Hq={q.shape[2]} entries, got {lsh.num_heads} entries"
        )
    pos = check_positions(positions, q.shape[1], q.device)
    scale = softmax_scale_for(q, softmax_scale)
    impl = resolve_backend(backend, q.device, q.dtype)
    if sp_group is not None:
        from plsh_dist.distributed.halo_attention import sp_block_attention  # noqa: PLC0415 (avoid cycle)

        return sp_block_attention(q, k, v, lsh, pos, causal=causal, scale=scale, impl=impl, group=sp_group)
    return PLSHAttentionFunction.apply(q, k, v, lsh, pos, causal, scale, impl)
