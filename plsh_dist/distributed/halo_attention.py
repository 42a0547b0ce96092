"""Sequence-parallel attention: positional LSH with a halo, exact ALiBi by
all-gather, windowed ALiBi with a halo of ``window - 1`` positions.

Each rank passes its contiguous chunk of q, k, v (B, T, H, D) and its global
positions, and gets its chunk of the output; every call is one autograd
Function that issues all of its communication itself, in one fixed order on
every rank, forward and backward (separate autograd collectives per tensor
can run their backward communication in different orders on different ranks).

Positional LSH (DESIGN.md section 4). The hash is a pure function of
position, so every rank computes every rank's halo (:mod:`.halo`). The work
splits in two pieces that call the single-process pure functions unchanged:

- *suffix* (causal only): local tokens from ``a`` on, whose queries from
  ``s`` on have their whole block inside the chunk (``s`` = first position
  after every (sample, head)'s first block; ``a`` = earliest start of the
  blocks holding ``s``). Computed while the halo is in flight.
- *extended*: halo keys/values + local tokens ``[0, s)`` (non-causal: the
  whole chunk + both halos). Halo rows get q = 0: their outputs are dropped,
  and in backward dout = out = lse = 0 there, so ``P = exp(0 - 0) = 1`` is
  finite and ``dS = P (dP - D) = 0``: they add exactly nothing to dk, dv.
  Rows ``[a, s)`` of the suffix are treated the same way.

In backward the extended piece runs first, its halo gradients are posted back
to their owners, and the suffix's backward overlaps that traffic.

Legend: B batch, T local tokens, Hq / Hkv query / key-value heads, D head dim,
L / R left / right halo slots.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from plsh_dist.distributed.comm_stats import record_bytes, record_call
from plsh_dist.distributed.halo import (
    HaloPlan, bucket_of, bucket_start, plsh_needs, post_grads, post_kv, window_needs,
)
from plsh_dist.distributed.sp_layout import SPLayout, dtype_code, exchange_layout, hash_fingerprint
from plsh_dist.ops.alibi import alibi_backward, alibi_forward, default_chunk_size
from plsh_dist.ops.merge import accum_dtype
from plsh_dist.ops.plsh import plsh_backward, plsh_forward

__all__ = ["sp_block_attention", "sp_alibi_attention", "all_gather_kv", "reduce_scatter_kv"]

_OPS = {"plsh": 1, "alibi_gather": 2, "alibi_window": 3}


def _signature(op: str, q, k, causal: bool, scale: float, needs_grad: bool, **extra) -> dict[str, int]:
    """Everything that must agree across the SP group, as ints."""
    sig = {
        "op": _OPS[op], "batch": q.shape[0], "q_heads": q.shape[2], "kv_heads": k.shape[2],
        "head_dim": q.shape[3], "dtype": dtype_code(q.dtype), "causal": int(causal),
        "softmax_scale_bits": struct.unpack("<q", struct.pack("<d", float(scale)))[0],
        "requires_grad": int(needs_grad),
    }
    sig.update({key: int(value) for key, value in extra.items()})
    return sig


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


# ---------------------------------------------------------------------------
# Positional LSH
# ---------------------------------------------------------------------------


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
    b_first = bucket_of(lsh, torch.full_like(lsh.shift, first, dtype=torch.long))
    s_abs = int(bucket_start(lsh, b_first + 1).max())
    if s_abs - first >= T:  # the first blocks cover the chunk: no halo-free query
        return _Split(T, T, T)
    b_s = bucket_of(lsh, torch.full_like(lsh.shift, s_abs, dtype=torch.long))
    a_abs = int(bucket_start(lsh, b_s).min())  # > first: every block holding s_abs starts after first
    return _Split(s_abs - first, a_abs - first, s_abs - first)


class SPBlockAttention(torch.autograd.Function):
    """Positional LSH attention over an SP group; saves q, k, v, out, lse and the halo."""

    @staticmethod
    def forward(ctx, q, k, v, lsh, pos, causal, scale, impl, group):
        B, T, Hq, D = q.shape
        needs_grad = any(ctx.needs_input_grad[:3])
        sig = _signature("plsh", q, k, causal, scale, needs_grad, hash=hash_fingerprint(lsh),
                         hash_heads=lsh.num_heads, samples=lsh.num_samples)
        layout = exchange_layout(group, pos, sig)
        record_call()
        plan = HaloPlan.build(layout, plsh_needs(lsh, layout, Hq, k.shape[2], causal))
        sp = _split(lsh, layout, causal)
        kw = dict(causal=causal, scale=scale, impl=impl)

        pending = post_kv(layout, plan, k, v)
        if sp.a < T:  # blocks that need no halo, computed while it is in flight
            q_s = _zero_head_rows(q[:, sp.a:], sp.s - sp.a)
            out_s, lse_s = plsh_forward(q_s, k[:, sp.a:], v[:, sp.a:], lsh, pos[sp.a:], **kw)
        halos = pending.wait()
        (lk, lv), (rk, rv) = halos["left"], halos["right"]
        L, R, e = lk.shape[1], rk.shape[1], sp.e
        q_e = _cat(_zeros_rows(q, L), q[:, :e], _zeros_rows(q, R))
        pos_e = _cat(plan.left_pos, pos[:e], plan.right_pos, dim=0)
        out_e, lse_e = plsh_forward(q_e, _cat(lk, k[:, :e], rk), _cat(lv, v[:, :e], rv), lsh, pos_e, **kw)
        out, lse = out_e[:, L:L + e], lse_e[:, :, L:L + e]
        if sp.a < T:
            out = _cat(out, out_s[:, sp.s - sp.a:])
            lse = _cat(lse, lse_s[:, :, sp.s - sp.a:], dim=2)
        out, lse = out.contiguous(), lse.contiguous()
        if needs_grad:
            ctx.save_for_backward(q, k, v, out, lse, lk, lv, rk, rv)
            ctx.lsh, ctx.pos, ctx.layout, ctx.plan, ctx.sp, ctx.kw = lsh, pos, layout, plan, sp, kw
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

        pos_e = _cat(ctx.plan.left_pos, pos[:e], ctx.plan.right_pos, dim=0)
        dq_e, dk_e, dv_e = plsh_backward(
            pad(dout), pad(q), _cat(lk, k[:, :e], rk), _cat(lv, v[:, :e], rv), pad(out), pad(lse, 2),
            lsh, pos_e, **kw,
        )
        halo_grads = {"left": (dk_e[:, :L], dv_e[:, :L]), "right": (dk_e[:, L + e:], dv_e[:, L + e:])}
        pending = post_grads(ctx.layout, ctx.plan, halo_grads, like=k)

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
            dq_s, dk_s, dv_s = plsh_backward(
                _zero_head_rows(dout[:, a:], n), _zero_head_rows(q[:, a:], n), k[:, a:], v[:, a:],
                _zero_head_rows(out[:, a:], n), _zero_head_rows(lse[:, :, a:], n, dim=2), lsh, pos[a:], **kw,
            )
            dq[:, sp.s:] = dq_s[:, n:]
            dk[:, a:] += dk_s
            dv[:, a:] += dv_s
        pending.wait_add(dk, dv)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


def sp_block_attention(q, k, v, lsh, pos, *, causal: bool, scale: float, impl: str, group) -> torch.Tensor:
    """Positional LSH attention of this rank's chunk under sequence parallelism.

    Args:
        q: (B, T, Hq, D); k, v: (B, T, Hkv, D): this rank's chunk.
        lsh: the shared hash (same seed on every rank; checked).
        pos: CPU LongTensor[T], this rank's contiguous global positions.
        group: the SP process group; group rank r holds the r-th chunk.
    Returns:
        (B, T, Hq, D), this rank's chunk of the output.
    """
    return SPBlockAttention.apply(q, k, v, lsh, pos, causal, scale, impl, group)


# ---------------------------------------------------------------------------
# Exact ALiBi: all-gather baseline
# ---------------------------------------------------------------------------


def _slopes_crc(slopes: torch.Tensor) -> int:
    return zlib.crc32(slopes.to(torch.float32).numpy().tobytes())


def all_gather_kv(layout: SPLayout, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Every rank's k, v (B, T, Hkv, D) -> (2, B, P*T, Hkv, D) in rank order; one collective."""
    P = layout.size
    kv = torch.stack([k, v]).contiguous()
    parts = [torch.empty_like(kv) for _ in range(P)]
    dist.all_gather(parts, kv, group=layout.group)
    nbytes = kv.numel() * kv.element_size()
    record_bytes("fwd", sent=(P - 1) * nbytes, recv=(P - 1) * nbytes)
    return torch.cat(parts, dim=2)


def reduce_scatter_kv(layout: SPLayout, dk_all: torch.Tensor, dv_all: torch.Tensor):
    """Sum every rank's (B, P*T, Hkv, D) dk, dv and keep this rank's chunk; one collective."""
    P = layout.size
    parts = [g.contiguous() for g in torch.stack([dk_all, dv_all]).chunk(P, dim=2)]
    mine = torch.empty_like(parts[0])
    dist.reduce_scatter(mine, parts, group=layout.group)
    nbytes = mine.numel() * mine.element_size()
    record_bytes("bwd", sent=(P - 1) * nbytes, recv=(P - 1) * nbytes)
    return mine[0], mine[1]


class SPAlibiGather(torch.autograd.Function):
    """Exact ALiBi: all-gather K/V forward, reduce-scatter dK/dV backward (O(T) per rank)."""

    @staticmethod
    def forward(ctx, q, k, v, pos, slopes, causal, scale, chunk, group):
        needs_grad = any(ctx.needs_input_grad[:3])
        sig = _signature("alibi_gather", q, k, causal, scale, needs_grad, slopes=_slopes_crc(slopes))
        layout = exchange_layout(group, pos, sig)
        record_call()
        P, T = layout.size, layout.length
        kv_all = all_gather_kv(layout, k, v)
        k_pos = torch.cat([torch.arange(f, f + T) for f in layout.firsts])
        chunk = chunk or default_chunk_size(q.shape[2], P * T)
        kw = dict(causal=causal, window=None, scale=scale, chunk=chunk)
        out, lse = alibi_forward(q, kv_all[0], kv_all[1], pos, k_pos, slopes, **kw)
        if needs_grad:
            ctx.save_for_backward(q, kv_all, out, lse)
            ctx.pos, ctx.k_pos, ctx.slopes, ctx.kw, ctx.layout = pos, k_pos, slopes, kw, layout
        return out

    @staticmethod
    def backward(ctx, dout):
        q, kv_all, out, lse = ctx.saved_tensors
        dq, dk_all, dv_all = alibi_backward(
            dout.contiguous(), q, kv_all[0], kv_all[1], out, lse, ctx.pos, ctx.k_pos, ctx.slopes, **ctx.kw
        )
        dk, dv = reduce_scatter_kv(ctx.layout, dk_all, dv_all)
        return dq, dk, dv, None, None, None, None, None, None


# ---------------------------------------------------------------------------
# Windowed ALiBi: halo of window - 1 positions
# ---------------------------------------------------------------------------


def _window_rows(T: int, window: int, causal: bool) -> tuple[int, int]:
    """Query rows [i0, i1) whose window lies inside the chunk (no halo needed)."""
    i0 = min(window - 1, T)
    i1 = T if causal else max(i0, T - (window - 1))
    return i0, i1


class SPAlibiWindow(torch.autograd.Function):
    """Sliding-window exact ALiBi; the rows near the chunk edges read the halo."""

    @staticmethod
    def forward(ctx, q, k, v, pos, slopes, causal, window, scale, chunk, group):
        B, T, Hq, D = q.shape
        needs_grad = any(ctx.needs_input_grad[:3])
        sig = _signature("alibi_window", q, k, causal, scale, needs_grad, slopes=_slopes_crc(slopes), window=window)
        layout = exchange_layout(group, pos, sig)
        record_call()
        plan = HaloPlan.build(layout, window_needs(window, layout, k.shape[2], causal))
        chunk = chunk or default_chunk_size(Hq, min(T + plan.left_pos.numel() + plan.right_pos.numel(), 2 * window))
        kw = dict(causal=causal, window=window, scale=scale, chunk=chunk)
        i0, i1 = _window_rows(T, window, causal)

        out = torch.empty_like(q)
        lse = torch.empty(B, Hq, T, dtype=accum_dtype(q.dtype), device=q.device)
        pending = post_kv(layout, plan, k, v)
        if i1 > i0:  # rows whose window is local, while the halo is in flight
            out[:, i0:i1], lse[:, :, i0:i1] = alibi_forward(q[:, i0:i1], k, v, pos[i0:i1], pos, slopes, **kw)
        halos = pending.wait()
        (lk, lv), (rk, rv) = halos["left"], halos["right"]
        k_e, v_e = _cat(lk, k, rk), _cat(lv, v, rv)
        pos_e = _cat(plan.left_pos, pos, plan.right_pos, dim=0)
        for a, b in ((0, i0), (i1, T)):
            if b > a:
                out[:, a:b], lse[:, :, a:b] = alibi_forward(q[:, a:b], k_e, v_e, pos[a:b], pos_e, slopes, **kw)
        if needs_grad:
            ctx.save_for_backward(q, k, v, out, lse, lk, lv, rk, rv)
            ctx.pos, ctx.slopes, ctx.kw, ctx.layout, ctx.plan = pos, slopes, kw, layout, plan
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, lk, lv, rk, rv = ctx.saved_tensors
        dout = dout.contiguous()
        pos, slopes, kw = ctx.pos, ctx.slopes, ctx.kw
        T, L = q.shape[1], lk.shape[1]
        i0, i1 = _window_rows(T, kw["window"], kw["causal"])
        acc = accum_dtype(q.dtype)
        k_e, v_e = _cat(lk, k, rk), _cat(lv, v, rv)
        pos_e = _cat(ctx.plan.left_pos, pos, ctx.plan.right_pos, dim=0)
        dq = torch.empty_like(q)
        dk_e = torch.zeros(k_e.shape, dtype=acc, device=k.device)
        dv_e = torch.zeros(v_e.shape, dtype=acc, device=v.device)
        for a, b in ((0, i0), (i1, T)):  # edge rows first: they yield the halo gradients
            if b > a:
                dq[:, a:b], dk_c, dv_c = alibi_backward(
                    dout[:, a:b], q[:, a:b], k_e, v_e, out[:, a:b], lse[:, :, a:b], pos[a:b], pos_e, slopes, **kw
                )
                dk_e += dk_c
                dv_e += dv_c
        halo_grads = {"left": (dk_e[:, :L], dv_e[:, :L]), "right": (dk_e[:, L + T:], dv_e[:, L + T:])}
        pending = post_grads(ctx.layout, ctx.plan, halo_grads, like=k)
        dk, dv = dk_e[:, L:L + T].clone(), dv_e[:, L:L + T].clone()
        if i1 > i0:
            dq[:, i0:i1], dk_c, dv_c = alibi_backward(
                dout[:, i0:i1], q[:, i0:i1], k, v, out[:, i0:i1], lse[:, :, i0:i1], pos[i0:i1], pos, slopes, **kw
            )
            dk += dk_c
            dv += dv_c
        pending.wait_add(dk, dv)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None


def sp_alibi_attention(q, k, v, pos, slopes, *, causal: bool, window, scale: float, chunk, group) -> torch.Tensor:
    """Exact (``window=None``: all-gather) or sliding-window (halo) ALiBi of this
    rank's chunk under sequence parallelism. Shapes as :func:`sp_block_attention`;
    ``slopes`` float32 Tensor[Hq]; ``chunk`` queries per chunk or None."""
    if window is None:
        return SPAlibiGather.apply(q, k, v, pos, slopes, causal, scale, chunk, group)
    return SPAlibiWindow.apply(q, k, v, pos, slopes, causal, window, scale, chunk, group)
