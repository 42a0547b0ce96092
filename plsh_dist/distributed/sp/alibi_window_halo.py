"""Sliding-window exact ALiBi under sequence parallelism: a halo of ``window - 1`` positions.

A query sees keys less than ``window`` positions away, so each rank needs
``window - 1`` positions before its chunk (and after it, non-causal) from its
neighbours (:func:`~plsh_dist.distributed.halo.window_needs`; a window wider
than a chunk reaches several ranks). Rows whose window lies inside the chunk
are computed while the halo is in flight; in backward the edge rows go first
and their halo gradients travel back while the inner rows compute.

Per-head windows (truncated ALiBi) move one halo, of the widest head's
``max_h w_h - 1`` positions: every key/value head ships the same positions,
and narrower heads' rows simply hide the keys beyond their own window.

Legend: B batch, T local tokens, Hq / Hkv query / key-value heads, D head dim, L left halo slots.
"""

from __future__ import annotations

import torch

from plsh_dist.distributed.comm_stats import record_call
from plsh_dist.distributed.halo import HaloPlan, post_grads, post_kv, window_needs
from plsh_dist.distributed.sp.documents import SPDocuments, alibi_rows_backward, alibi_rows_forward, documents_crc
from plsh_dist.distributed.sp.signature import call_signature, slopes_crc, window_code
from plsh_dist.distributed.sp_layout import exchange_layout
from plsh_dist.ops.alibi import default_chunk_size, widest_window
from plsh_dist.ops.merge import accum_dtype

__all__ = ["SPAlibiWindow"]


def _window_rows(T: int, window: int, causal: bool) -> tuple[int, int]:
    """Query rows [i0, i1) whose window lies inside the chunk (no halo needed)."""
    i0 = min(window - 1, T)
    i1 = T if causal else max(i0, T - (window - 1))
    return i0, i1


class SPAlibiWindow(torch.autograd.Function):
    """Sliding-window exact ALiBi; the rows near the chunk edges read the halo."""

    @staticmethod
    def forward(ctx, q, k, v, pos, slopes, causal, window, scale, chunk, group, cu_seqlens=None):
        B, T, Hq, D = q.shape
        needs_grad = any(ctx.needs_input_grad[:3])
        sig = call_signature("alibi_window", q, k, causal, scale, needs_grad, slopes=slopes_crc(slopes),
                             window=window_code(window), documents=documents_crc(cu_seqlens))
        layout = exchange_layout(group, pos, sig)
        record_call()
        docs = None if cu_seqlens is None else SPDocuments.build(cu_seqlens, layout, B)
        widest = widest_window(window)
        plan = HaloPlan.build(layout, window_needs(widest, layout, k.shape[2], causal, docs))
        if not isinstance(window, tuple):  # per-head windows: each window group's own chunk (alibi_forward)
            chunk = chunk or default_chunk_size(Hq, min(T + plan.left_pos.numel() + plan.right_pos.numel(),
                                                         2 * window))
        kw = dict(causal=causal, window=window, scale=scale, chunk=chunk)
        i0, i1 = _window_rows(T, widest, causal)

        out = torch.empty_like(q)
        lse = torch.empty(B, Hq, T, dtype=accum_dtype(q.dtype), device=q.device)
        pending = post_kv(layout, plan, k, v)
        if i1 > i0:  # rows whose window is local, while the halo is in flight
            out[:, i0:i1], lse[:, :, i0:i1] = alibi_rows_forward(q[:, i0:i1], k, v, pos[i0:i1], pos, slopes, docs,
                                                                 **kw)
        halos = pending.wait()
        (lk, lv), (rk, rv) = halos["left"], halos["right"]
        k_e, v_e = torch.cat([lk, k, rk], dim=1), torch.cat([lv, v, rv], dim=1)
        pos_e = torch.cat([plan.left_pos, pos, plan.right_pos])
        for a, b in ((0, i0), (i1, T)):
            if b > a:
                out[:, a:b], lse[:, :, a:b] = alibi_rows_forward(q[:, a:b], k_e, v_e, pos[a:b], pos_e, slopes, docs,
                                                                 **kw)
        if needs_grad:
            ctx.save_for_backward(q, k, v, out, lse, lk, lv, rk, rv)
            ctx.pos, ctx.slopes, ctx.kw, ctx.layout, ctx.plan, ctx.docs = pos, slopes, kw, layout, plan, docs
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, lk, lv, rk, rv = ctx.saved_tensors
        dout = dout.contiguous()
        pos, slopes, kw = ctx.pos, ctx.slopes, ctx.kw
        T, L = q.shape[1], lk.shape[1]
        i0, i1 = _window_rows(T, widest_window(kw["window"]), kw["causal"])
        acc = accum_dtype(q.dtype)
        k_e, v_e = torch.cat([lk, k, rk], dim=1), torch.cat([lv, v, rv], dim=1)
        pos_e = torch.cat([ctx.plan.left_pos, pos, ctx.plan.right_pos])
        dq = torch.empty_like(q)
        dk_e = torch.zeros(k_e.shape, dtype=acc, device=k.device)
        dv_e = torch.zeros(v_e.shape, dtype=acc, device=v.device)
        for a, b in ((0, i0), (i1, T)):  # edge rows first: they yield the halo gradients
            if b > a:
                dq[:, a:b], dk_c, dv_c = alibi_rows_backward(
                    dout[:, a:b], q[:, a:b], k_e, v_e, out[:, a:b], lse[:, :, a:b], pos[a:b], pos_e, slopes,
                    ctx.docs, **kw
                )
                dk_e += dk_c
                dv_e += dv_c
        halo_grads = {"left": (dk_e[:, :L], dv_e[:, :L]), "right": (dk_e[:, L + T:], dv_e[:, L + T:])}
        pending = post_grads(ctx.layout, ctx.plan, halo_grads, like=k)
        dk, dv = dk_e[:, L:L + T].clone(), dv_e[:, L:L + T].clone()
        if i1 > i0:
            dq[:, i0:i1], dk_c, dv_c = alibi_rows_backward(
                dout[:, i0:i1], q[:, i0:i1], k, v, out[:, i0:i1], lse[:, :, i0:i1], pos[i0:i1], pos, slopes,
                ctx.docs, **kw
            )
            dk += dk_c
            dv += dv_c
        pending.wait_add(dk, dv)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None, None
