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

On CUDA with Triton (where one process runs windows on the fused kernel:
``alibi_attention`` without ``chunk_size``, no documents), the rank runs the
kernel once the halo is in, over its chunk with the halo's keys on either
side: the halo slots' query rows are zeros and their outputs dropped; in
backward their ``dout`` is zero (so they add nothing to dK, dV) and the halo
keys' gradients go back to their ranks.

Legend: B batch, T local tokens, Hq / Hkv query / key-value heads, D head dim, L left halo slots.
"""

from __future__ import annotations

import torch

from plsh_dist.distributed.comm_stats import record_call
from plsh_dist.distributed.halo import HaloExchange, post_grads, post_kv, window_needs
from plsh_dist.distributed.sp.documents import SPDocuments, alibi_rows_backward, alibi_rows_forward, documents_crc
from plsh_dist.distributed.sp.signature import call_signature, slopes_crc, window_code
from plsh_dist.distributed.sp_layout import exchange_layout
from plsh_dist.ops.alibi import default_chunk_size, head_windows, widest_window
from plsh_dist.ops.kernel_bias import KernelBias
from plsh_dist.ops.merge import accum_dtype
from plsh_dist.ops.tile_bands import TokenLayout, WindowBias
from plsh_dist.ops.triton_onepass import banded_backward, banded_forward, kernel_tiles, triton_cuda


def _window_rows(T: int, window: int, causal: bool) -> tuple[int, int]:
    """Query rows [i0, i1) whose window lies inside the chunk (no halo needed)."""
    i0 = min(window - 1, T)
    i1 = T if causal else max(i0, T - (window - 1))
    return i0, i1


def _pad_rows(x: torch.Tensor, left: int, right: int, value: float = 0.0, dim: int = 1) -> torch.Tensor:
    """``x`` with ``left`` / ``right`` rows of ``value`` added along ``dim`` (the halo slots)."""
    shape = list(x.shape)
    parts = []
    for n in (left, right):
        shape[dim] = n
        parts.append(x.new_full(shape, value))
    return torch.cat([parts[0], x, parts[1]], dim=dim)


class _KernelWindow:
    """The window bias on the fused kernel over the chunk with its halo (module doc): tokens are
    ``L`` left halo slots, the chunk's T, then the right slots, at positions ``pos_e``."""

    def __init__(self, q, slopes, window, pos_e: torch.Tensor, causal: bool, scale: float):
        self.bias = WindowBias.of(slopes.to(torch.float32).reciprocal(), head_windows(window, q.shape[2]), q.device)
        self.layout = TokenLayout.build(pos_e, q.device)
        self.causal, self.scale = causal, scale
        self.kernel_bias = KernelBias.of(self.bias, self.layout, causal, kernel_tiles(q))

    def forward(self, q, k_e, v_e, L: int, R: int):
        """(out, lse) of the chunk's T rows: (B, T, Hq, D), (B, Hq, T) fp32."""
        T = q.shape[1]
        out_e, lse_e = banded_forward(_pad_rows(q, L, R), k_e, v_e, self.bias, self.layout, causal=self.causal,
                                      scale=self.scale, kernel_bias=self.kernel_bias)
        return out_e[:, L:L + T], lse_e[:, :, L:L + T]

    def backward(self, dout, q, k_e, v_e, out, lse, L: int, R: int):
        """dq (B, T, Hq, D) and dk_e, dv_e over the chunk with its halo; the halo rows' lse is -inf
        (no key seen: zero gradients) and their dout zero."""
        dq_e, dk_e, dv_e = banded_backward(_pad_rows(dout, L, R), _pad_rows(q, L, R), k_e, v_e, _pad_rows(out, L, R),
                                           _pad_rows(lse, L, R, float("-inf"), dim=2), self.bias, self.layout,
                                           causal=self.causal, scale=self.scale, kernel_bias=self.kernel_bias)
        return dq_e[:, L:L + q.shape[1]], dk_e, dv_e


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
        exchange = HaloExchange.build(layout, window_needs(widest, layout, k.shape[2], causal, docs))
        on_kernel = chunk is None and docs is None and triton_cuda(q.device, q.dtype)  # one process's choice
        if not isinstance(window, tuple):  # per-head windows: each window group's own chunk (alibi_forward)
            chunk = chunk or default_chunk_size(Hq, min(T + exchange.left_pos.numel() + exchange.right_pos.numel(),
                                                         2 * window))
        kw = dict(causal=causal, window=window, scale=scale, chunk=chunk)
        i0, i1 = _window_rows(T, widest, causal)

        if on_kernel:
            halos = post_kv(layout, exchange, k, v).wait()
            (lk, lv), (rk, rv) = halos["left"], halos["right"]
            pos_e = torch.cat([exchange.left_pos, pos, exchange.right_pos])
            kernel = _KernelWindow(q, slopes, window, pos_e, causal, scale)
            out, lse = kernel.forward(q, torch.cat([lk, k, rk], 1), torch.cat([lv, v, rv], 1), lk.shape[1],
                                      rk.shape[1])
            if needs_grad:
                ctx.save_for_backward(q, k, v, out, lse, lk, lv, rk, rv)
                ctx.kernel, ctx.layout, ctx.exchange = kernel, layout, exchange
            return out
        out = torch.empty_like(q)
        lse = torch.empty(B, Hq, T, dtype=accum_dtype(q.dtype), device=q.device)
        pending = post_kv(layout, exchange, k, v)
        if i1 > i0:  # rows whose window is local, while the halo is in flight
            out[:, i0:i1], lse[:, :, i0:i1] = alibi_rows_forward(q[:, i0:i1], k, v, pos[i0:i1], pos, slopes, docs,
                                                                 **kw)
        halos = pending.wait()
        (lk, lv), (rk, rv) = halos["left"], halos["right"]
        k_e, v_e = torch.cat([lk, k, rk], dim=1), torch.cat([lv, v, rv], dim=1)
        pos_e = torch.cat([exchange.left_pos, pos, exchange.right_pos])
        for a, b in ((0, i0), (i1, T)):
            if b > a:
                out[:, a:b], lse[:, :, a:b] = alibi_rows_forward(q[:, a:b], k_e, v_e, pos[a:b], pos_e, slopes, docs,
                                                                 **kw)
        if needs_grad:
            ctx.save_for_backward(q, k, v, out, lse, lk, lv, rk, rv)
            ctx.pos, ctx.slopes, ctx.kw, ctx.layout, ctx.exchange, ctx.docs = pos, slopes, kw, layout, exchange, docs
            ctx.kernel = None
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, lk, lv, rk, rv = ctx.saved_tensors
        dout = dout.contiguous()
        if ctx.kernel is not None:
            return SPAlibiWindow._kernel_backward(ctx, dout, q, k, v, out, lse, lk, lv, rk, rv)
        pos, slopes, kw = ctx.pos, ctx.slopes, ctx.kw
        T, L = q.shape[1], lk.shape[1]
        i0, i1 = _window_rows(T, widest_window(kw["window"]), kw["causal"])
        acc = accum_dtype(q.dtype)
        k_e, v_e = torch.cat([lk, k, rk], dim=1), torch.cat([lv, v, rv], dim=1)
        pos_e = torch.cat([ctx.exchange.left_pos, pos, ctx.exchange.right_pos])
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
        pending = post_grads(ctx.layout, ctx.exchange, halo_grads, like=k)
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

    @staticmethod
    def _kernel_backward(ctx, dout, q, k, v, out, lse, lk, lv, rk, rv):
        L, R, T = lk.shape[1], rk.shape[1], q.shape[1]
        dq, dk_e, dv_e = ctx.kernel.backward(dout, q, torch.cat([lk, k, rk], 1), torch.cat([lv, v, rv], 1), out,
                                             lse, L, R)
        halo_grads = {"left": (dk_e[:, :L], dv_e[:, :L]), "right": (dk_e[:, L + T:], dv_e[:, L + T:])}
        pending = post_grads(ctx.layout, ctx.exchange, halo_grads, like=k)
        dk, dv = dk_e[:, L:L + T].to(accum_dtype(k.dtype)), dv_e[:, L:L + T].to(accum_dtype(v.dtype))
        pending.wait_add(dk, dv)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None, None
