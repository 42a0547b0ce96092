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

Where the call's kernel is the fused one (the caller's
:func:`~plsh_dist.ops.alibi_kernel.choose_alibi_kernel`: CUDA with Triton, no ``chunk_size``)
and there are no documents, the rank runs the
kernel once the halo is in, over its chunk with the halo's keys on either
side: the halo slots' query rows are zeros and their outputs dropped; in
backward their ``dout`` is zero (so they add nothing to dK, dV) and the halo
keys' gradients go back to their ranks.

Legend: B batch, T local tokens, Hq / Hkv query / key-value heads, D head dim, L left halo slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.distributed.comm_stats import record_call
from plsh_dist.distributed.halo import HaloExchange, post_grads, post_kv, window_needs
from plsh_dist.distributed.sp.documents import SPDocuments, alibi_rows_backward, alibi_rows_forward, documents_crc
from plsh_dist.distributed.sp.signature import call_signature, slopes_crc, window_code
from plsh_dist.distributed.group_chunks import GroupChunks, exchange_chunks
from plsh_dist.ops.alibi import default_chunk_size, head_windows, widest_window
from plsh_dist.ops.alibi_kernel import AlibiKernel
from plsh_dist.ops.triton import KernelBias, TokenLayout, WindowBias, banded_backward, banded_forward, kernel_tiles
from plsh_dist.ops.merge import accum_dtype


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


@dataclass(frozen=True)
class WindowPlan:
    """One call's plan, the same on every rank: who sends what, which rows need the halo, and whether
    the fused kernel runs it (the caller's kernel, and no documents)."""

    chunks: GroupChunks
    exchange: HaloExchange
    pos: torch.Tensor
    slopes: torch.Tensor
    docs: SPDocuments | None
    kw: dict
    on_kernel: bool

    @classmethod
    def make(cls, q, k, pos, slopes, causal: bool, window, scale: float, chunk: int | None, kernel: str, group,
             cu_seqlens, needs_grad: bool) -> "WindowPlan":
        """Validate the call across the group (one small all-gather) and plan it; ``kernel``: the call's
        (:func:`~plsh_dist.ops.alibi_kernel.choose_alibi_kernel`)."""
        B, T, Hq, D = q.shape
        sig = call_signature("alibi_window", q, k, causal, scale, needs_grad, slopes=slopes_crc(slopes),
                             window=window_code(window), documents=documents_crc(cu_seqlens))
        chunks = exchange_chunks(group, pos, sig)
        docs = None if cu_seqlens is None else SPDocuments.build(cu_seqlens, chunks, B)
        exchange = HaloExchange.build(chunks, window_needs(widest_window(window), chunks, k.shape[2], causal, docs))
        on_kernel = kernel == AlibiKernel.FUSED and docs is None
        if not isinstance(window, tuple):  # per-head windows: each window group's own chunk (alibi_forward)
            chunk = chunk or default_chunk_size(Hq, min(T + exchange.left_pos.numel() + exchange.right_pos.numel(),
                                                         2 * window))
        return cls(chunks, exchange, pos, slopes, docs, dict(causal=causal, window=window, scale=scale, chunk=chunk),
                   on_kernel)

    @property
    def pos_e(self) -> torch.Tensor:
        """Positions of the left halo slots, the chunk, the right slots."""
        return torch.cat([self.exchange.left_pos, self.pos, self.exchange.right_pos])

    def fetch(self, k, v, phase: str = "fwd"):
        """The halo keys and values ``(lk, lv, rk, rv)``, each (B, L or R, Hkv, D) (blocking)."""
        halos = post_kv(self.chunks, self.exchange, k, v, phase).wait()
        return (*halos["left"], *halos["right"])

    def kernel(self, q) -> _KernelWindow:
        return _KernelWindow(q, self.slopes, self.kw["window"], self.pos_e, self.kw["causal"], self.kw["scale"])

    def forward(self, q, k, v):
        """``(out, lse, halo, kernel)``: out (B, T, Hq, D), lse (B, Hq, T), the halo (:meth:`fetch`) and the
        fused kernel's bias (None on the chunked path), for :meth:`backward`."""
        B, T, Hq, D = q.shape
        if self.on_kernel:
            lk, lv, rk, rv = halo = self.fetch(k, v)
            kernel = self.kernel(q)
            out, lse = kernel.forward(q, torch.cat([lk, k, rk], 1), torch.cat([lv, v, rv], 1), lk.shape[1],
                                      rk.shape[1])
            return out, lse, halo, kernel
        pos, slopes, docs, kw = self.pos, self.slopes, self.docs, self.kw
        i0, i1 = _window_rows(T, widest_window(kw["window"]), kw["causal"])
        out = torch.empty_like(q)
        lse = torch.empty(B, Hq, T, dtype=accum_dtype(q.dtype), device=q.device)
        pending = post_kv(self.chunks, self.exchange, k, v)
        if i1 > i0:  # rows whose window is local, while the halo is in flight
            out[:, i0:i1], lse[:, :, i0:i1] = alibi_rows_forward(q[:, i0:i1], k, v, pos[i0:i1], pos, slopes, docs,
                                                                 **kw)
        halos = pending.wait()
        lk, lv, rk, rv = halo = (*halos["left"], *halos["right"])
        k_e, v_e, pos_e = torch.cat([lk, k, rk], dim=1), torch.cat([lv, v, rv], dim=1), self.pos_e
        for a, b in ((0, i0), (i1, T)):
            if b > a:
                out[:, a:b], lse[:, :, a:b] = alibi_rows_forward(q[:, a:b], k_e, v_e, pos[a:b], pos_e, slopes, docs,
                                                                 **kw)
        return out, lse, halo, None

    def backward(self, dout, q, k, v, out, lse, halo, kernel=None):
        """``(dq, dk, dv)``: the edge rows first (they yield the halo gradients, sent home while the inner
        rows compute); ``kernel``: the forward's (remade when None on the kernel path)."""
        dout = dout.contiguous()
        if self.on_kernel:
            return self._kernel_backward(kernel or self.kernel(q), dout, q, k, v, out, lse, halo)
        lk, lv, rk, rv = halo
        pos, slopes, kw, docs = self.pos, self.slopes, self.kw, self.docs
        T, L = q.shape[1], lk.shape[1]
        i0, i1 = _window_rows(T, widest_window(kw["window"]), kw["causal"])
        acc = accum_dtype(q.dtype)
        k_e, v_e, pos_e = torch.cat([lk, k, rk], dim=1), torch.cat([lv, v, rv], dim=1), self.pos_e
        dq = torch.empty_like(q)
        dk_e = torch.zeros(k_e.shape, dtype=acc, device=k.device)
        dv_e = torch.zeros(v_e.shape, dtype=acc, device=v.device)
        for a, b in ((0, i0), (i1, T)):
            if b > a:
                dq[:, a:b], dk_c, dv_c = alibi_rows_backward(
                    dout[:, a:b], q[:, a:b], k_e, v_e, out[:, a:b], lse[:, :, a:b], pos[a:b], pos_e, slopes, docs,
                    **kw
                )
                dk_e += dk_c
                dv_e += dv_c
        halo_grads = {"left": (dk_e[:, :L], dv_e[:, :L]), "right": (dk_e[:, L + T:], dv_e[:, L + T:])}
        pending = post_grads(self.chunks, self.exchange, halo_grads, like=k)
        dk, dv = dk_e[:, L:L + T].clone(), dv_e[:, L:L + T].clone()
        if i1 > i0:
            dq[:, i0:i1], dk_c, dv_c = alibi_rows_backward(
                dout[:, i0:i1], q[:, i0:i1], k, v, out[:, i0:i1], lse[:, :, i0:i1], pos[i0:i1], pos, slopes, docs,
                **kw
            )
            dk += dk_c
            dv += dv_c
        pending.wait_add(dk, dv)
        return dq, dk.to(k.dtype), dv.to(v.dtype)

    def _kernel_backward(self, kernel: _KernelWindow, dout, q, k, v, out, lse, halo):
        lk, lv, rk, rv = halo
        L, R, T = lk.shape[1], rk.shape[1], q.shape[1]
        dq, dk_e, dv_e = kernel.backward(dout, q, torch.cat([lk, k, rk], 1), torch.cat([lv, v, rv], 1), out, lse,
                                         L, R)
        halo_grads = {"left": (dk_e[:, :L], dv_e[:, :L]), "right": (dk_e[:, L + T:], dv_e[:, L + T:])}
        pending = post_grads(self.chunks, self.exchange, halo_grads, like=k)
        dk, dv = dk_e[:, L:L + T].to(accum_dtype(k.dtype)), dv_e[:, L:L + T].to(accum_dtype(v.dtype))
        pending.wait_add(dk, dv)
        return dq, dk.to(k.dtype), dv.to(v.dtype)


class SPAlibiWindow(torch.autograd.Function):
    """Sliding-window exact ALiBi, eagerly; saves q, k, v, out, lse and the halo."""

    @staticmethod
    def forward(ctx, q, k, v, pos, slopes, causal, window, scale, chunk, kernel, group, cu_seqlens=None):
        needs_grad = any(ctx.needs_input_grad[:3])
        plan = WindowPlan.make(q, k, pos, slopes, causal, window, scale, chunk, kernel, group, cu_seqlens,
                               needs_grad)
        record_call()
        out, lse, halo, kernel = plan.forward(q, k, v)
        if needs_grad:
            ctx.save_for_backward(q, k, v, out, lse, *halo)
            ctx.plan, ctx.kernel = plan, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *halo = ctx.saved_tensors
        grads = ctx.plan.backward(dout, q, k, v, out, lse, halo, ctx.kernel)
        return (*grads, None, None, None, None, None, None, None, None, None)
