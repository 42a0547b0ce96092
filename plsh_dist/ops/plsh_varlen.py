"""PLSH forward/backward on the varlen (CUDA) kernels: one call per sample.

Same contract as ``plsh_forward`` / ``plsh_backward`` in :mod:`plsh_dist.ops.plsh`
(which dispatch here for the varlen implementations). Tensors are laid
out once along the rows axis of :mod:`plsh_dist.ops.varlen_plan` (all heads
with per-head hashes, all batch rows), so each sample is a single varlen call
over every head and row, usually one launch (more only past 65535 blocks).
Samples are merged by log-sum-exp in fp32 in that layout.

Host synchronisation: one per forward, in :func:`plan_samples` (the block
starts come back to the host because the kernels take the number of blocks
and ``max_seqlen`` as host integers); the backward reuses the forward's plan
(``PLSHAttentionFunction`` keeps it), so it never waits.

Memory: with per-head hashes and GQA (g = Hq / Hkv > 1), k and v are
repeated to Hq heads in the rows layout (one copy each, not one per sample);
gradients accumulate in fp32.

Legend: B batch, T tokens, Hq / Hkv query / key-value heads, D head dim,
R rows, Hc heads per row (Hq for a shared hash, 1 per-head).
"""

from __future__ import annotations

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.backends import Impl
from plsh_dist.ops.gqa import repeat_kv, sum_kv_repeats
from plsh_dist.ops.merge import accum_dtype, merge_into
from plsh_dist.ops.varlen_kernels import varlen_bwd, varlen_fwd
from plsh_dist.ops.varlen_plan import VarlenChunk, plan_samples

__all__ = ["varlen_plsh_forward", "varlen_plsh_backward"]


def _to_rows(x_BTHD: torch.Tensor, per_head: bool, repeat: int = 1) -> torch.Tensor:
    """(B, T, H, D) -> rows: shared hash (B*T, H, D); per-head (H*repeat*B*T, 1, D)."""
    B, T, H, D = x_BTHD.shape
    if not per_head:
        return x_BTHD.reshape(B * T, H, D)
    x_HBTD = x_BTHD.permute(2, 0, 1, 3)
    x_HBTD = repeat_kv(x_HBTD, repeat, dim=0)  # kv head j serves query heads j*g .. j*g+g-1
    return x_HBTD.reshape(-1, 1, D)  # copies (permute is not contiguous)


def _from_rows(x_RHD: torch.Tensor, B: int, T: int, per_head: bool) -> torch.Tensor:
    """Inverse of :func:`_to_rows` (without repeat): rows -> (B, T, H, D)."""
    D = x_RHD.shape[-1]
    if not per_head:
        return x_RHD.view(B, T, -1, D)
    return x_RHD.view(-1, B, T, D).permute(1, 2, 0, 3)


def _lse_from_rows(lse_HR: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """(Hc, R) -> (B, Hq, T); rows are (b, i) or (h, b, i), so both layouts read as (Hq, B, T)."""
    return lse_HR.view(-1, B, T).transpose(0, 1)


def _lse_to_rows(lse_BHT: torch.Tensor, per_head: bool) -> torch.Tensor:
    """(B, Hq, T) -> (Hc, R) contiguous, fp32 (fp64 stays fp64)."""
    lse_HBT = lse_BHT.transpose(0, 1).to(accum_dtype(lse_BHT.dtype))
    return lse_HBT.reshape(1 if per_head else lse_HBT.shape[0], -1).contiguous()


def varlen_plsh_forward(q, k, v, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool, scale: float,
                        impl: Impl, plan: list[list[VarlenChunk]] | None = None, docs=None):
    """Merged block attention over all samples (see ``plsh_forward``).

    q: (B, T, Hq, D); k, v: (B, T, Hkv, D); positions CPU LongTensor[T].
    ``plan``: from :func:`plan_samples` (computed here when None).
    ``docs``: documents of a batch-1 call (:mod:`plsh_dist.ops.documents`): blocks are cut there too.
    Returns out (B, T, Hq, D) in q's dtype and lse (B, Hq, T) fp32 (fp64 for fp64).
    """
    B, T, Hq, D = q.shape
    per_head = lsh.num_heads > 1
    g = Hq // k.shape[2]
    plan = plan if plan is not None else plan_samples(lsh, positions, B, q.device, docs=docs)
    q_rows = _to_rows(q, per_head)
    k_rows, v_rows = (_to_rows(x, per_head, g) for x in (k, v))
    acc = accum_dtype(q.dtype)
    out_rows = torch.empty(q_rows.shape, dtype=acc, device=q.device)  # merged over samples
    lse_rows = torch.empty(q_rows.shape[1], q_rows.shape[0], dtype=acc, device=q.device)  # (Hc, R)
    for t, chunks in enumerate(plan):
        for c in chunks:
            a, b = c.row_start, c.row_end
            o, l = varlen_fwd(q_rows[a:b], k_rows[a:b], v_rows[a:b], c.cu_seqlens, c.max_len,
                              causal=causal, scale=scale, kernel=impl.kernel)
            if t == 0:  # every row lies in one block of every sample: sample 0 fills all rows
                out_rows[a:b] = o
                lse_rows[:, a:b] = l
            else:  # merge_into's (B, T, H, D) / (B, H, T) layout with B = 1 over this row range
                _, merged_lse = merge_into(out_rows[None, a:b], lse_rows[None, :, a:b], o[None], l[None])
                lse_rows[:, a:b] = merged_lse[0]
    out = _from_rows(out_rows, B, T, per_head).to(q.dtype)
    return out, _lse_from_rows(lse_rows, B, T)


def varlen_plsh_backward(dout, q, k, v, out, lse, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool,
                         scale: float, impl: Impl, plan: list[list[VarlenChunk]] | None = None, docs=None):
    """Gradients of :func:`varlen_plsh_forward` with the merged ``out`` / ``lse``.

    ``plan``: the forward's (recomputed when None).
    Returns dq (B, T, Hq, D), dk, dv (B, T, Hkv, D) in the inputs' dtype.
    """
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    per_head = lsh.num_heads > 1
    g = Hq // Hkv
    plan = plan if plan is not None else plan_samples(lsh, positions, B, q.device, docs=docs)
    q_rows, out_rows, dout_rows = (_to_rows(x, per_head) for x in (q, out.to(q.dtype), dout.to(q.dtype)))
    k_rows, v_rows = (_to_rows(x, per_head, g) for x in (k, v))
    lse_rows = _lse_to_rows(lse, per_head)
    acc = accum_dtype(q.dtype)
    dq_rows = torch.zeros(q_rows.shape, dtype=acc, device=q.device)
    dk_rows = torch.zeros(k_rows.shape, dtype=acc, device=q.device)
    dv_rows = torch.zeros(v_rows.shape, dtype=acc, device=q.device)
    for chunks in plan:
        for c in chunks:
            a, b = c.row_start, c.row_end
            dq_c, dk_c, dv_c = varlen_bwd(
                dout_rows[a:b], q_rows[a:b], k_rows[a:b], v_rows[a:b], out_rows[a:b], lse_rows[:, a:b],
                c.cu_seqlens, c.max_len, causal=causal, scale=scale, kernel=impl.kernel,
            )
            dq_rows[a:b] += dq_c
            dk_rows[a:b] += dk_c
            dv_rows[a:b] += dv_c
    dq = _from_rows(dq_rows, B, T, per_head)
    if per_head:
        # rows (Hq = Hkv * g, B, T): sum each kv head's g repeated copies
        dk, dv = (sum_kv_repeats(x.view(Hq, B, T, D), g, dim=0).permute(1, 2, 0, 3) for x in (dk_rows, dv_rows))
    else:
        dk, dv = (x.view(B, T, Hkv, D) for x in (dk_rows, dv_rows))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
