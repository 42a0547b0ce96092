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
from plsh_dist.distributed.group_chunks import GroupChunks, exchange_chunks, hash_fingerprint
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


def _split(lsh, chunks: GroupChunks, causal: bool) -> _Split:
    T, first = chunks.length, chunks.first
    if not causal:
        return _Split(T, T, T)
    s_abs = int(lsh.next_block_start(first).max())
    if s_abs - first >= T:  # the first blocks cover the chunk: no halo-free query
        return _Split(T, T, T)
    a_abs = int(lsh.block_start_of(s_abs).min())  # > first: every block holding s_abs starts after first
    return _Split(s_abs - first, a_abs - first, s_abs - first)


@dataclass(frozen=True)
class HaloPlan:
    """One call's plan, derived identically on every rank from the hash and the group's chunks: who sends
    what (``exchange``), the split into extended piece and suffix, and the pieces' documents."""

    lsh: object
    pos: torch.Tensor
    strategy: object
    chunks: GroupChunks
    exchange: HaloExchange
    split: _Split
    docs_e: Documents | None
    docs_s: Documents | None
    kw: dict

    @classmethod
    def make(cls, q, k, lsh, pos, causal: bool, scale: float, strategy, group, cu_seqlens,
             needs_grad: bool) -> "HaloPlan":
        """Validate the call across the group (one small all-gather) and plan it."""
        B, T, Hq, D = q.shape
        sig = call_signature("plsh", q, k, causal, scale, needs_grad, hash=hash_fingerprint(lsh),
                             hash_heads=lsh.num_heads, samples=lsh.num_samples, documents=documents_crc(cu_seqlens))
        chunks = exchange_chunks(group, pos, sig)
        docs = None if cu_seqlens is None else SPDocuments.build(cu_seqlens, chunks, B)
        exchange = HaloExchange.build(chunks, plsh_needs(lsh, chunks, Hq, k.shape[2], causal, docs))
        sp = _split(lsh, chunks, causal)
        pos_e = _cat(exchange.left_pos, pos[:sp.e], exchange.right_pos, dim=0)
        docs_e = None if docs is None else docs.flat(pos_e)
        docs_s = None if docs is None or sp.a >= T else docs.flat(pos[sp.a:])
        return cls(lsh, pos, strategy, chunks, exchange, sp, docs_e, docs_s, dict(causal=causal, scale=scale))

    @property
    def pos_e(self) -> torch.Tensor:
        """Positions of the extended piece: left halo slots, the chunk's first e tokens, right slots."""
        return _cat(self.exchange.left_pos, self.pos[:self.split.e], self.exchange.right_pos, dim=0)

    def fetch(self, k, v, phase: str = "fwd"):
        """The halo keys and values ``(lk, lv, rk, rv)``, each (B, L or R, Hkv, D) (blocking)."""
        halos = post_kv(self.chunks, self.exchange, k, v, phase).wait()
        return (*halos["left"], *halos["right"])

    def forward(self, q, k, v):
        """``(out, lse, halo, saved)``: out (B, T, Hq, D), lse (B, Hq, T) contiguous, the halo
        (:meth:`fetch`) and the strategy's saved state of both pieces (for :meth:`backward`)."""
        T, sp, kw, lsh, pos = q.shape[1], self.split, self.kw, self.lsh, self.pos
        pending = post_kv(self.chunks, self.exchange, k, v)
        saved_s = None
        if sp.a < T:  # blocks that need no halo, computed while it is in flight
            q_s = _zero_head_rows(q[:, sp.a:], sp.s - sp.a)
            out_s, lse_s, saved_s = _forward(self.strategy, q_s, k[:, sp.a:], v[:, sp.a:], lsh, pos[sp.a:],
                                             self.docs_s, **kw)
        halos = pending.wait()
        lk, lv, rk, rv = halo = (*halos["left"], *halos["right"])
        L, e = lk.shape[1], sp.e
        q_e = _cat(_zeros_rows(q, L), q[:, :e], _zeros_rows(q, rk.shape[1]))
        out_e, lse_e, saved_e = _forward(self.strategy, q_e, _cat(lk, k[:, :e], rk), _cat(lv, v[:, :e], rv), lsh,
                                         self.pos_e, self.docs_e, **kw)
        out, lse = out_e[:, L:L + e], lse_e[:, :, L:L + e]
        if sp.a < T:
            out = _cat(out, out_s[:, sp.s - sp.a:])
            lse = _cat(lse, lse_s[:, :, sp.s - sp.a:], dim=2)
        return out.contiguous(), lse.contiguous(), halo, (saved_e, saved_s)

    def forward_state(self, q, k, v, halo):
        """The strategies' saved state of both pieces, remade by running their forwards again (what an op's
        backward needs for a strategy whose backward takes it: its ``backward_takes_saved``)."""
        T, sp, kw = q.shape[1], self.split, self.kw
        lk, lv, rk, rv = halo
        L, e = lk.shape[1], sp.e
        q_e = _cat(_zeros_rows(q, L), q[:, :e], _zeros_rows(q, rk.shape[1]))
        saved_e = _forward(self.strategy, q_e, _cat(lk, k[:, :e], rk), _cat(lv, v[:, :e], rv), self.lsh, self.pos_e,
                           self.docs_e, **kw)[2]
        saved_s = None
        if sp.a < T:
            saved_s = _forward(self.strategy, _zero_head_rows(q[:, sp.a:], sp.s - sp.a), k[:, sp.a:], v[:, sp.a:],
                               self.lsh, self.pos[sp.a:], self.docs_s, **kw)[2]
        return saved_e, saved_s

    def backward(self, dout, q, k, v, out, lse, halo, saved):
        """``(dq, dk, dv)`` in the inputs' dtypes: the extended piece first (it yields the halo gradients,
        sent home while the suffix computes), then the suffix; ``halo`` and ``saved`` as :meth:`forward`'s."""
        lk, lv, rk, rv = halo
        saved_e, saved_s = saved
        dout = dout.contiguous()
        lsh, pos, sp, kw = self.lsh, self.pos, self.split, self.kw
        B, T, Hq, D = q.shape
        L, R, e = lk.shape[1], rk.shape[1], sp.e
        acc = accum_dtype(q.dtype)

        def pad(x, dim=1):  # zero halo rows around local rows [0, e)
            return _cat(_zeros_rows(x, L, dim), x.narrow(dim, 0, e), _zeros_rows(x, R, dim), dim=dim)

        dq_e, dk_e, dv_e = _backward(
            self.strategy, saved_e, pad(dout), pad(q), _cat(lk, k[:, :e], rk), _cat(lv, v[:, :e], rv), pad(out),
            pad(lse, 2), lsh, self.pos_e, self.docs_e, **kw,
        )
        halo_grads = {"left": (dk_e[:, :L], dv_e[:, :L]), "right": (dk_e[:, L + e:], dv_e[:, L + e:])}
        pending = post_grads(self.chunks, self.exchange, halo_grads, like=k)

        dq = torch.empty_like(q)  # the suffix while the halo gradients travel
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        dq[:, :e] = dq_e[:, L:L + e]
        dk[:, :e] += dk_e[:, L:L + e]
        dv[:, :e] += dv_e[:, L:L + e]
        if sp.a < T:
            n, a = sp.s - sp.a, sp.a
            dq_s, dk_s, dv_s = _backward(
                self.strategy, saved_s, _zero_head_rows(dout[:, a:], n), _zero_head_rows(q[:, a:], n), k[:, a:],
                v[:, a:], _zero_head_rows(out[:, a:], n), _zero_head_rows(lse[:, :, a:], n, dim=2), lsh, pos[a:],
                self.docs_s, **kw,
            )
            dq[:, sp.s:] = dq_s[:, n:]
            dk[:, a:] += dk_s
            dv[:, a:] += dv_s
        pending.wait_add(dk, dv)
        return dq, dk.to(k.dtype), dv.to(v.dtype)


class SPBlockAttention(torch.autograd.Function):
    """Positional LSH attention over an SP group, eagerly; saves q, k, v, out, lse and the halo."""

    @staticmethod
    def forward(ctx, q, k, v, lsh, pos, causal, scale, strategy, group, cu_seqlens=None):
        needs_grad = any(ctx.needs_input_grad[:3])
        plan = HaloPlan.make(q, k, lsh, pos, causal, scale, strategy, group, cu_seqlens, needs_grad)
        record_call()
        out, lse, halo, saved = plan.forward(q, k, v)
        if needs_grad:
            ctx.save_for_backward(q, k, v, out, lse, *halo)
            ctx.plan, ctx.saved = plan, saved
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *halo = ctx.saved_tensors
        return (*ctx.plan.backward(dout, q, k, v, out, lse, halo, ctx.saved), None, None, None, None, None, None, None)
