"""Exact ALiBi under sequence parallelism: the all-gather baseline (no halo).

Exact ALiBi gives every key a nonzero weight, so each rank needs every key:
the forward all-gathers K/V (``(P - 1) * chunk`` per rank, ring attention's
volume) and the backward reduce-scatters dK/dV; each rank then runs the
single-process :func:`~plsh_dist.ops.alibi.alibi_forward` /
:func:`~plsh_dist.ops.alibi.alibi_backward` on its queries against all keys
(with packed documents, only its queries' documents' keys are computed on).

Legend: B batch, T local tokens, P ranks, Hq / Hkv query / key-value heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from plsh_dist.distributed.comm_stats import record_bytes, record_call
from plsh_dist.distributed.sp.documents import SPDocuments, alibi_rows_backward, alibi_rows_forward, documents_crc
from plsh_dist.distributed.sp.signature import call_signature, slopes_crc
from plsh_dist.distributed.group_chunks import GroupChunks, exchange_chunks
from plsh_dist.ops.alibi import default_chunk_size


def all_gather_kv(chunks: GroupChunks, k: torch.Tensor, v: torch.Tensor, phase: str = "fwd") -> torch.Tensor:
    """Every rank's k, v (B, T, Hkv, D) -> (2, B, P*T, Hkv, D) in rank order; one collective (counted
    in ``phase``: "bwd" for a backward that gathers again)."""
    P = chunks.size
    kv = torch.stack([k, v]).contiguous()
    parts = [torch.empty_like(kv) for _ in range(P)]
    dist.all_gather(parts, kv, group=chunks.group)
    nbytes = kv.numel() * kv.element_size()
    record_bytes(phase, sent=(P - 1) * nbytes, recv=(P - 1) * nbytes)
    return torch.cat(parts, dim=2)


def reduce_scatter_kv(chunks: GroupChunks, dk_all: torch.Tensor, dv_all: torch.Tensor):
    """Sum every rank's (B, P*T, Hkv, D) dk, dv and keep this rank's chunk; one collective."""
    P = chunks.size
    parts = [g.contiguous() for g in torch.stack([dk_all, dv_all]).chunk(P, dim=2)]
    mine = torch.empty_like(parts[0])
    dist.reduce_scatter(mine, parts, group=chunks.group)
    nbytes = mine.numel() * mine.element_size()
    record_bytes("bwd", sent=(P - 1) * nbytes, recv=(P - 1) * nbytes)
    return mine[0], mine[1]


@dataclass(frozen=True)
class GatherPlan:
    """One call's plan, the same on every rank: the group's chunks, every key's position and the documents."""

    chunks: GroupChunks
    pos: torch.Tensor
    k_pos: torch.Tensor
    slopes: torch.Tensor
    docs: SPDocuments | None
    kw: dict

    @classmethod
    def make(cls, q, k, pos, slopes, causal: bool, scale: float, chunk: int | None, group, cu_seqlens,
             needs_grad: bool) -> "GatherPlan":
        """Validate the call across the group (one small all-gather) and plan it."""
        sig = call_signature("alibi_gather", q, k, causal, scale, needs_grad, slopes=slopes_crc(slopes),
                             documents=documents_crc(cu_seqlens))
        chunks = exchange_chunks(group, pos, sig)
        P, T = chunks.size, chunks.length
        docs = None if cu_seqlens is None else SPDocuments.build(cu_seqlens, chunks, q.shape[0])
        k_pos = torch.cat([torch.arange(f, f + T) for f in chunks.firsts])
        chunk = chunk or default_chunk_size(q.shape[2], P * T)
        return cls(chunks, pos, k_pos, slopes, docs, dict(causal=causal, window=None, scale=scale, chunk=chunk))

    def gather(self, k, v, phase: str = "fwd") -> torch.Tensor:
        """Every rank's keys and values, (2, B, P*T, Hkv, D)."""
        return all_gather_kv(self.chunks, k, v, phase)

    def forward(self, q, kv_all):
        """``(out, lse)`` of this rank's queries against every key."""
        return alibi_rows_forward(q, kv_all[0], kv_all[1], self.pos, self.k_pos, self.slopes, self.docs, **self.kw)

    def backward(self, dout, q, kv_all, out, lse):
        """``(dq, dk, dv)``: dk, dv of every key reduce-scattered to their ranks."""
        dq, dk_all, dv_all = alibi_rows_backward(dout.contiguous(), q, kv_all[0], kv_all[1], out, lse, self.pos,
                                                 self.k_pos, self.slopes, self.docs, **self.kw)
        dk, dv = reduce_scatter_kv(self.chunks, dk_all, dv_all)
        return dq, dk, dv


class SPAlibiGather(torch.autograd.Function):
    """Exact ALiBi, eagerly: all-gather K/V forward, reduce-scatter dK/dV backward (O(T) per rank)."""

    @staticmethod
    def forward(ctx, q, k, v, pos, slopes, causal, scale, chunk, group, cu_seqlens=None):
        needs_grad = any(ctx.needs_input_grad[:3])
        plan = GatherPlan.make(q, k, pos, slopes, causal, scale, chunk, group, cu_seqlens, needs_grad)
        record_call()
        kv_all = plan.gather(k, v)
        out, lse = plan.forward(q, kv_all)
        if needs_grad:
            ctx.save_for_backward(q, kv_all, out, lse)
            ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, dout):
        q, kv_all, out, lse = ctx.saved_tensors
        return (*ctx.plan.backward(dout, q, kv_all, out, lse), None, None, None, None, None, None, None)
