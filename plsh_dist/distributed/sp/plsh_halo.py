"""Positional LSH attention under sequence parallelism: a halo of keys/values.

Each rank passes its contiguous chunk of q, k, v (B, T, H, D) and its global positions, and gets its
chunk of the output; the call is one autograd Function that issues all of its communication itself,
in one fixed order on every rank, forward and backward. Every rank computes every rank's halo from
the hash (:mod:`plsh_dist.distributed.halo`); the work splits into a halo-free *suffix*, computed
while the halo travels, and an *extended* piece (halo + the chunk's first tokens), both on the
single-process strategy unchanged, with q = 0 on rows that serve only as keys. Packed documents
(:mod:`plsh_dist.distributed.sp.documents`) cut blocks and the halo at document starts. The split,
why the key-only rows add nothing to dk, dv, and the backward's order: docs/design.md, section 3,
"PLSH halo".

Legend: B batch, T local tokens, Hq / Hkv query / key-value heads, D head dim,
L / R left / right halo slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.distributed.comm_stats import record_call
from plsh_dist.distributed.halo import HaloExchange, plsh_needs, post_grads, post_kv
from plsh_dist.distributed.sp.documents import SPDocuments, documents_crc
from plsh_dist.distributed.sp.signature import call_signature
from plsh_dist.distributed.sp_layout import SPLayout, exchange_layout, hash_fingerprint
from plsh_dist.ops.documents import BatchRows, Documents
from plsh_dist.ops.merge import accum_dtype


def _cat(*xs: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return torch.cat(xs, dim=dim)


def _zeros_rows(like: torch.Tensor, n: int, dim: int = 1) -> torch.Tensor:
    shape = list(like.shape)
    shape[dim] = n
    return like.new_zeros(shape)


def _zero_head_rows(x: torch.Tensor, n: int, dim: int = 1) -> torch.Tensor:
    """Copy of ``x`` with its first ``n`` rows along ``dim`` set to zero."""
    x = x.clone()
    x.narrow(dim, 0, n).zero_()
    return x


def _forward(strategy, q, k, v, lsh, pos, docs: Documents | None, **kw):
    """``strategy.forward`` of (B, n) tensors at positions ``pos`` (LongTensor[n]): (out, lse, saved);
    with the flattened rows' documents ``docs`` (:meth:`SPDocuments.flat` of ``pos``), on those rows."""
    rows = BatchRows.of(q, docs is not None)
    out, lse, saved = strategy.forward(*rows.inputs(q, k, v), lsh, pos if docs is None else docs.positions, docs=docs,
                                       **kw)
    return (*rows.outputs(out, lse), saved)


def _backward(strategy, saved, dout, q, k, v, out, lse, lsh, pos, docs: Documents | None, **kw):
    """``strategy.backward`` as :func:`_forward` (the forward's ``docs`` and ``saved``); lse (B, Hq, n)."""
    rows = BatchRows.of(q, docs is not None)
    return rows.grads(strategy.backward(*rows.inputs(dout, q, k, v, out), rows.lse_input(lse), lsh,
                                        pos if docs is None else docs.positions, docs=docs, saved=saved, **kw))


@dataclass(frozen=True)
class _Split:
    """Local indices: extended piece holds tokens [0, e); suffix tokens [a, T), queries [s, T)."""

    e: int
    a: int
    s: int


def _split(lsh, layout: SPLayout, causal: bool) -> _Split:
    T, first = layout.length, layout.first
    if not causal:
        return _Split(T, T, T)
    s_abs = int(lsh.next_block_start(first).max())
    if s_abs - first >= T:  # the first blocks cover the chunk: no halo-free query
        return _Split(T, T, T)
    a_abs = int(lsh.block_start_of(s_abs).min())  # > first: every block holding s_abs starts after first
    return _Split(s_abs - first, a_abs - first, s_abs - first)


class SPBlockAttention(torch.autograd.Function):
    """Positional LSH attention over an SP group; saves q, k, v, out, lse and the halo."""

    @staticmethod
    def forward(ctx, q, k, v, lsh, pos, causal, scale, strategy, group, cu_seqlens=None):
        B, T, Hq, D = q.shape
        needs_grad = any(ctx.needs_input_grad[:3])
        sig = call_signature("plsh", q, k, causal, scale, needs_grad, hash=hash_fingerprint(lsh),
                             hash_heads=lsh.num_heads, samples=lsh.num_samples, documents=documents_crc(cu_seqlens))
        layout = exchange_layout(group, pos, sig)
        record_call()
        docs = None if cu_seqlens is None else SPDocuments.build(cu_seqlens, layout, B)
        exchange = HaloExchange.build(layout, plsh_needs(lsh, layout, Hq, k.shape[2], causal, docs))
        sp = _split(lsh, layout, causal)
        kw = dict(causal=causal, scale=scale)

        pending = post_kv(layout, exchange, k, v)
        docs_s = saved_s = None
        if sp.a < T:  # blocks that need no halo, computed while it is in flight
            q_s = _zero_head_rows(q[:, sp.a:], sp.s - sp.a)
            docs_s = None if docs is None else docs.flat(pos[sp.a:])  # kept for the backward
            out_s, lse_s, saved_s = _forward(strategy, q_s, k[:, sp.a:], v[:, sp.a:], lsh, pos[sp.a:], docs_s, **kw)
        halos = pending.wait()
        (lk, lv), (rk, rv) = halos["left"], halos["right"]
        L, R, e = lk.shape[1], rk.shape[1], sp.e
        q_e = _cat(_zeros_rows(q, L), q[:, :e], _zeros_rows(q, R))
        pos_e = _cat(exchange.left_pos, pos[:e], exchange.right_pos, dim=0)
        docs_e = None if docs is None else docs.flat(pos_e)
        out_e, lse_e, saved_e = _forward(strategy, q_e, _cat(lk, k[:, :e], rk), _cat(lv, v[:, :e], rv), lsh, pos_e,
                                         docs_e, **kw)
        out, lse = out_e[:, L:L + e], lse_e[:, :, L:L + e]
        if sp.a < T:
            out = _cat(out, out_s[:, sp.s - sp.a:])
            lse = _cat(lse, lse_s[:, :, sp.s - sp.a:], dim=2)
        out, lse = out.contiguous(), lse.contiguous()
        if needs_grad:
            ctx.save_for_backward(q, k, v, out, lse, lk, lv, rk, rv)
            ctx.lsh, ctx.pos, ctx.layout, ctx.exchange, ctx.sp, ctx.kw = lsh, pos, layout, exchange, sp, kw
            ctx.docs_e, ctx.docs_s = docs_e, docs_s
            ctx.strategy, ctx.saved_e, ctx.saved_s = strategy, saved_e, saved_s
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, lk, lv, rk, rv = ctx.saved_tensors
        dout = dout.contiguous()
        lsh, pos, sp, kw = ctx.lsh, ctx.pos, ctx.sp, ctx.kw
        B, T, Hq, D = q.shape
        L, R, e = lk.shape[1], rk.shape[1], sp.e
        acc = accum_dtype(q.dtype)

        # 1. extended piece first: it yields the halo gradients to send back.
        def pad(x, dim=1):  # zero halo rows around local rows [0, e)
            return _cat(_zeros_rows(x, L, dim), x.narrow(dim, 0, e), _zeros_rows(x, R, dim), dim=dim)

        pos_e = _cat(ctx.exchange.left_pos, pos[:e], ctx.exchange.right_pos, dim=0)
        dq_e, dk_e, dv_e = _backward(
            ctx.strategy, ctx.saved_e, pad(dout), pad(q), _cat(lk, k[:, :e], rk), _cat(lv, v[:, :e], rv), pad(out),
            pad(lse, 2), lsh, pos_e, ctx.docs_e, **kw,
        )
        halo_grads = {"left": (dk_e[:, :L], dv_e[:, :L]), "right": (dk_e[:, L + e:], dv_e[:, L + e:])}
        pending = post_grads(ctx.layout, ctx.exchange, halo_grads, like=k)

        # 2. suffix while the halo gradients travel.
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        dq[:, :e] = dq_e[:, L:L + e]
        dk[:, :e] += dk_e[:, L:L + e]
        dv[:, :e] += dv_e[:, L:L + e]
        if sp.a < T:
            n = sp.s - sp.a
            a = sp.a
            dq_s, dk_s, dv_s = _backward(
                ctx.strategy, ctx.saved_s, _zero_head_rows(dout[:, a:], n), _zero_head_rows(q[:, a:], n), k[:, a:],
                v[:, a:],
                _zero_head_rows(out[:, a:], n), _zero_head_rows(lse[:, :, a:], n, dim=2), lsh, pos[a:], ctx.docs_s,
                **kw,
            )
            dq[:, sp.s:] = dq_s[:, n:]
            dk[:, a:] += dk_s
            dv[:, a:] += dv_s
        pending.wait_add(dk, dv)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None
