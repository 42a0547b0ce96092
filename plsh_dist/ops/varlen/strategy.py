"""PLSH per sample on the varlen (CUDA) kernels: one call per sample (the strategy
:class:`VarlenPerSample`).

Tensors are laid
out once along the rows axis of :mod:`plsh_dist.ops.varlen.calls` (all heads
with per-head hashes, all batch rows), so each sample is a single varlen call
over every head and row, usually one launch (more only past 65535 blocks).
Samples are merged by log-sum-exp in fp32 in that layout.

Host synchronisation: one per forward, in :func:`varlen_calls` (the block
starts come back to the host because the kernels take the number of blocks
and ``max_seqlen`` as host integers). The forward returns what it saved
(:class:`VarlenSaved`: the calls and the kernel's LSE layout) and the backward
reuses it, so the backward never waits.

Memory: with per-head hashes and GQA (g = Hq / Hkv > 1), k and v are
repeated to Hq heads in the rows layout (one copy each, not one per sample);
gradients accumulate in fp32.

Legend: B batch, T tokens, Hq / Hkv query / key-value heads, D head dim,
R rows, Hc heads per row (Hq for a shared hash, 1 per-head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.gqa import repeat_kv, sum_kv_repeats
from plsh_dist.ops.head_groups import head_groups
from plsh_dist.ops.merge import accum_dtype, merge_into
from plsh_dist.ops.strategy import Strategy
from plsh_dist.ops.varlen.kernels import VarlenKernel, varlen_bwd, varlen_fwd
from plsh_dist.ops.varlen.calls import VarlenChunk, varlen_calls


@dataclass(frozen=True)
class VarlenSaved:
    """What the backward reuses from the forward.

    Attributes:
        samples: ``samples[t]`` is sample t's varlen calls (:func:`varlen_calls`).
        lse_padded: whether the kernel gave its LSE padded (its backward wants it so).
    """

    samples: list[list[VarlenChunk]]
    lse_padded: bool


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


def varlen_forward(q, k, v, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool, scale: float,
                   kernel: VarlenKernel, docs=None):
    """Merged block attention over all samples.

    q: (B, T, Hq, D); k, v: (B, T, Hkv, D); positions CPU LongTensor[T].
    ``docs``: documents of a batch-1 call (:mod:`plsh_dist.ops.documents`): blocks are cut there too.
    Returns out (B, T, Hq, D) in q's dtype, lse (B, Hq, T) fp32 (fp64 for fp64) and the
    :class:`VarlenSaved` for the backward.
    """
    B, T, Hq, D = q.shape
    heads = head_groups(lsh, Hq, k.shape[2])
    per_head, g = not heads.shared, heads.kv_repeat
    calls = varlen_calls(lsh, positions, B, q.device, docs=docs)  # the op's one host sync
    q_rows = _to_rows(q, per_head)
    k_rows, v_rows = (_to_rows(x, per_head, g) for x in (k, v))
    acc = accum_dtype(q.dtype)
    out_rows = torch.empty(q_rows.shape, dtype=acc, device=q.device)  # merged over samples
    lse_rows = torch.empty(q_rows.shape[1], q_rows.shape[0], dtype=acc, device=q.device)  # (Hc, R)
    lse_padded = False
    for t, chunks in enumerate(calls):
        for c in chunks:
            a, b = c.row_start, c.row_end
            o, l, lse_padded = varlen_fwd(q_rows[a:b], k_rows[a:b], v_rows[a:b], c.cu_seqlens, c.max_len,
                                          causal=causal, scale=scale, kernel=kernel)
            if t == 0:  # every row lies in one block of every sample: sample 0 fills all rows
                out_rows[a:b] = o
                lse_rows[:, a:b] = l
            else:  # merge_into's (B, T, H, D) / (B, H, T) layout with B = 1 over this row range
                _, merged_lse = merge_into(out_rows[None, a:b], lse_rows[None, :, a:b], o[None], l[None])
                lse_rows[:, a:b] = merged_lse[0]
    out = _from_rows(out_rows, B, T, per_head).to(q.dtype)
    return out, _lse_from_rows(lse_rows, B, T), VarlenSaved(calls, lse_padded)


def varlen_backward(dout, q, k, v, out, lse, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool,
                    scale: float, kernel: VarlenKernel, saved: VarlenSaved):
    """Gradients of :func:`varlen_forward` with the merged ``out`` / ``lse`` and what the forward saved.

    Returns dq (B, T, Hq, D), dk, dv (B, T, Hkv, D) in the inputs' dtype.
    """
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    heads = head_groups(lsh, Hq, Hkv)
    per_head, g = not heads.shared, heads.kv_repeat
    q_rows, out_rows, dout_rows = (_to_rows(x, per_head) for x in (q, out.to(q.dtype), dout.to(q.dtype)))
    k_rows, v_rows = (_to_rows(x, per_head, g) for x in (k, v))
    lse_rows = _lse_to_rows(lse, per_head)
    acc = accum_dtype(q.dtype)
    dq_rows = torch.zeros(q_rows.shape, dtype=acc, device=q.device)
    dk_rows = torch.zeros(k_rows.shape, dtype=acc, device=q.device)
    dv_rows = torch.zeros(v_rows.shape, dtype=acc, device=q.device)
    for chunks in saved.samples:
        for c in chunks:
            a, b = c.row_start, c.row_end
            dq_c, dk_c, dv_c = varlen_bwd(
                dout_rows[a:b], q_rows[a:b], k_rows[a:b], v_rows[a:b], out_rows[a:b], lse_rows[:, a:b],
                c.cu_seqlens, c.max_len, causal=causal, scale=scale, kernel=kernel, lse_padded=saved.lse_padded,
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


@dataclass(frozen=True)
class VarlenPerSample(Strategy):
    """Strategy: one varlen call per sample over all heads and rows, merged by log-sum-exp."""

    kernel: VarlenKernel
    keeps_host_state = backward_takes_saved = True
    cost_model = "varlen"

    def forward(self, q, k, v, lsh, positions, *, causal, scale, docs=None):
        """``(out, lse, saved)``: ``saved`` (:class:`VarlenSaved`) is the backward's."""
        return varlen_forward(q, k, v, lsh, positions, causal=causal, scale=scale, kernel=self.kernel, docs=docs)

    def backward(self, dout, q, k, v, out, lse, lsh, positions, *, causal, scale, docs=None, saved=None):
        """``(dq, dk, dv)`` with what the forward saved."""
        if saved is None:
            raise ValueError("the varlen strategy's backward needs what its forward saved "
                             "(the third value forward returns)")
        return varlen_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale,
                               kernel=self.kernel, saved=saved)
