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

from dataclasses import dataclass

import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH
from plsh_dist.ops import backend_torch, backend_varlen_cuda
from plsh_dist.ops.blocks import BlockLayout
from plsh_dist.ops.merge import accum_dtype, merge_into
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


@dataclass(frozen=True)
class _HeadGroup:
    """Query heads that share one hash, and the key/value heads they read."""

    hash_head: int
    q_heads: slice
    kv_heads: slice
    expand_kv: int  # repeat each kv head this many times (padded path, shared hash)


def _head_groups(num_hash_heads: int, Hq: int, Hkv: int) -> list[_HeadGroup]:
    g = Hq // Hkv
    if num_hash_heads == 1:  # one hash for every head: one call serves all heads
        return [_HeadGroup(0, slice(0, Hq), slice(0, Hkv), g)]
    return [_HeadGroup(h, slice(h, h + 1), slice(h // g, h // g + 1), 1) for h in range(Hq)]


# ---------------------------------------------------------------------------
# Layer 1: pure forward / backward
# ---------------------------------------------------------------------------


def _group_kv(x_BTHD: torch.Tensor, group: _HeadGroup, impl: str) -> torch.Tensor:
    x = x_BTHD[:, :, group.kv_heads]
    if impl.startswith("padded") and group.expand_kv > 1:
        x = x.repeat_interleave(group.expand_kv, dim=2)  # padded kernels need Hq == Hkv
    return x


def _layouts(lsh: PositionalLSH, positions: torch.Tensor, device: torch.device):
    """Yield (sample, hash head, BlockLayout) for every (t, h); layouts are cheap, never stored."""
    buckets = lsh.buckets(positions)  # (s, H, n) on CPU
    for t in range(buckets.shape[0]):
        for h in range(buckets.shape[1]):
            yield t, h, BlockLayout.from_buckets(buckets[t, h], device)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merged block attention over all samples.

    Args:
        q: (B, T, Hq, D); k, v: (B, T, Hkv, D).
        lsh: hash with 1 or Hq heads; positions: CPU LongTensor[T], increasing.
    Returns:
        out (B, T, Hq, D) in q's dtype, lse (B, Hq, T) in fp32 (fp64 for fp64).
    """
    B, T, Hq, D = q.shape
    groups = _head_groups(lsh.num_heads, Hq, k.shape[2])
    kvs = [(_group_kv(k, g, impl), _group_kv(v, g, impl)) for g in groups]
    acc = accum_dtype(q.dtype)
    out, lse = None, None
    sample_out = torch.empty(B, T, Hq, D, dtype=q.dtype, device=q.device)
    sample_lse = torch.empty(B, Hq, T, dtype=acc, device=q.device)
    for t, h, layout in _layouts(lsh, positions, q.device):
        group = groups[h]
        k_g, v_g = kvs[h]
        o, l = _block_fwd(q[:, :, group.q_heads], k_g, v_g, layout, causal=causal, scale=scale, impl=impl)
        sample_out[:, :, group.q_heads] = o
        sample_lse[:, group.q_heads] = l
        if h == len(groups) - 1:  # every head of sample t done: merge it
            out, lse = merge_into(out, lse, sample_out, sample_lse)
    return out.to(q.dtype), lse


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`plsh_forward`: every sample's block backward with the
    merged ``out`` and ``lse``, summed (DESIGN.md section 2).

    Returns dq (B, T, Hq, D), dk, dv (B, T, Hkv, D) in the inputs' dtype.
    """
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    groups = _head_groups(lsh.num_heads, Hq, Hkv)
    kvs = [(_group_kv(k, g, impl), _group_kv(v, g, impl)) for g in groups]
    acc = accum_dtype(q.dtype)
    dq = torch.zeros(B, T, Hq, D, dtype=acc, device=q.device)
    dk = torch.zeros(B, T, Hkv, D, dtype=acc, device=q.device)
    dv = torch.zeros(B, T, Hkv, D, dtype=acc, device=q.device)
    for _, h, layout in _layouts(lsh, positions, q.device):
        group = groups[h]
        k_g, v_g = kvs[h]
        hs = group.q_heads
        dq_g, dk_g, dv_g = _block_bwd(
            dout[:, :, hs], q[:, :, hs], k_g, v_g, out[:, :, hs], lse[:, hs], layout,
            causal=causal, scale=scale, impl=impl,
        )
        dq[:, :, hs] += dq_g
        if dk_g.shape[2] != group.kv_heads.stop - group.kv_heads.start:  # expanded GQA heads: sum groups
            dk_g = dk_g.view(B, T, -1, group.expand_kv, D).sum(dim=3)
            dv_g = dv_g.view(B, T, -1, group.expand_kv, D).sum(dim=3)
        dk[:, :, group.kv_heads] += dk_g
        dv[:, :, group.kv_heads] += dv_g
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _block_fwd(q, k, v, layout: BlockLayout, *, causal, scale, impl):
    if impl.startswith("varlen"):
        provider = "flash_attn" if impl == "varlen_flash_attn" else "aten"
        return backend_varlen_cuda.varlen_fwd(
            q, k, v, layout.cu_seqlens, layout.max_len, causal=causal, scale=scale, provider=provider
        )
    kernel = "math" if impl == "padded_math" else None
    return backend_torch.block_fwd(q, k, v, layout, causal=causal, scale=scale, kernel=kernel)


def _block_bwd(dout, q, k, v, out, lse, layout: BlockLayout, *, causal, scale, impl):
    if impl.startswith("varlen"):
        provider = "flash_attn" if impl == "varlen_flash_attn" else "aten"
        return backend_varlen_cuda.varlen_bwd(
            dout, q, k, v, out, lse, layout.cu_seqlens, layout.max_len, causal=causal, scale=scale,
            provider=provider,
        )
    kernel = "math" if impl == "padded_math" else None
    return backend_torch.block_bwd(dout, q, k, v, out, lse, layout, causal=causal, scale=scale, kernel=kernel)


# ---------------------------------------------------------------------------
# Layer 2: autograd
# ---------------------------------------------------------------------------


class PLSHAttentionFunction(torch.autograd.Function):
    """Saves q, k, v, out, lse only: activation memory does not grow with s."""

    @staticmethod
    def forward(ctx, q, k, v, lsh, positions, causal, scale, impl):
        out, lse = plsh_forward(q, k, v, lsh, positions, causal=causal, scale=scale, impl=impl)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.lsh, ctx.positions, ctx.causal, ctx.scale, ctx.impl = lsh, positions, causal, scale, impl
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = plsh_backward(
            dout.contiguous(), q, k, v, out, lse, ctx.lsh, ctx.positions,
            causal=ctx.causal, scale=ctx.scale, impl=ctx.impl,
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
