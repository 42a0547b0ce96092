"""Exact ALiBi attention (optionally sliding-window), and plain causal attention: the
baselines Positional LSH is measured against.

On CUDA (sm >= 80, Triton) a call runs on the fused banded kernel, as flash-attn runs
ALiBi: each head over the key tiles of its own window, every key without one
(:func:`kernel_call`), packed documents included; the table chooses, once per call
(:func:`~plsh_dist.ops.alibi_kernel.choose_alibi_kernel`), and the op and its backward take
the answer. Elsewhere it runs in chunks of
queries against the key range they can see, with the bias ``-m_h |p_i - p_j|`` built
per chunk: memory O(T * chunk * H) instead of O(T^2 * H), also in backward (which
recomputes each chunk from the saved out and lse).

The window may differ per head (truncated ALiBi: ``w_h = ceil(c * sigma_h)``
drops only weights below ``e^-c``): each group of heads that share a window
runs on its own, in chunks sized by that window, so a narrow head does not pay
for a wide one's key range.

Three layers: the pure ``alibi_forward`` / ``alibi_backward``; the custom op
``plsh_dist::alibi_attention`` and its autograd formula (:mod:`plsh_dist.ops.custom_ops`:
saves q, k, v, out, lse only; the backward recomputes), so
``torch.compile(fullgraph=True)`` keeps one graph; the public ``alibi_attention``.

Single process only: sequence parallelism (:mod:`plsh_dist.distributed.sp`)
calls ``alibi_forward`` / ``alibi_backward`` on its gathered keys or halo.

Legend: B batch, Tq / Tk query / key tokens, Hq query heads, Hkv key/value
heads, D head dim, C chunk of queries, K keys seen by a chunk.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from plsh_dist.ops import triton as fused
from plsh_dist.ops.alibi_band import band_chunk, banded_backward, banded_forward, interior_rows
from plsh_dist.ops.alibi_kernel import AlibiKernel, choose_alibi_kernel
from plsh_dist.ops.custom_ops import NAMESPACE, fake_backward, fake_forward, register_autograd
from plsh_dist.ops.dense import dense_bwd, dense_fwd
from plsh_dist.ops.triton import KernelBias, TokenLayout, WindowBias, device_constant, host_key
from plsh_dist.ops.documents import BatchRows, flat_documents
from plsh_dist.ops.gqa import repeat_kv, sum_kv_repeats
from plsh_dist.ops.layout import device_layout, host_layout
from plsh_dist.ops.input_checks import check_positions, check_qkv, softmax_scale_for
from plsh_dist.ops.merge import accum_dtype

#: ``c = ln s + EQUAL_COST_OFFSET``: truncated ALiBi at ``w_h = ceil(c sigma_h)`` attends as many
#: keys per query as positional LSH's one-pass band of s samples (about ``sigma H_s``, the mean
#: of the largest of s Exp(sigma) block reaches; 0.58 is Euler's constant, the large-s limit of
#: ``H_s - ln s``; measured: ``experiments/approximation/equal_cost.py``).
EQUAL_COST_OFFSET = 0.58
#: Exact ALiBi's window on the fused kernel: every key (the kernel's positions are below 2^31).
UNBOUNDED_WINDOW = 2**31 - 1


def equal_cost_c(num_samples: int) -> float:
    """``c = ln s + 0.58``: the window, in units of sigma, of ``s`` samples' one-pass band."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    return math.log(num_samples) + EQUAL_COST_OFFSET


def truncation_windows(c: float, sigma) -> torch.Tensor:
    """Truncated ALiBi's windows ``w_h = ceil(c * sigma_h)``, LongTensor[H] (H = 1 for a float
    sigma): the weights ``exp(-|i - j| / sigma_h)`` it drops are below ``e^-c``."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not (c > 0 and math.isfinite(c)):
        raise ValueError(f"c must be a finite float > 0 (the window in units of sigma), got {c!r}")
    sig = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1)
    if sig.numel() == 0 or not bool(torch.isfinite(sig).all()) or bool((sig <= 0).any()):
        raise ValueError(f"sigma must be finite and > 0 for every head, got {sig.tolist()}")
    return torch.ceil(c * sig).to(torch.long)


# Bias bytes per chunk: Hq * C * K * 4 stays below this.
_CHUNK_BIAS_BYTES = 64 * 2**20


def default_chunk_size(num_heads: int, num_keys: int) -> int:
    """Largest multiple of 16 in [16, 1024] with the chunk's bias under 64 MiB."""
    c = _CHUNK_BIAS_BYTES // (4 * num_heads * max(num_keys, 1))
    return int(min(1024, max(16, c - c % 16)))


def window_chunk_size(num_heads: int, window: int, num_keys: int) -> int:
    """Queries per chunk for heads of window ``w``: a multiple of 16, at least 64 and ``w``
    (a chunk of C queries reads about C + w keys for w useful ones; fewer, smaller
    chunks cost more in per-call overhead than they save), within the memory bound of
    :func:`default_chunk_size`."""
    want = max(64, -(-window // 16) * 16)
    return min(want, default_chunk_size(num_heads, min(num_keys, want + 2 * window)))


def check_window(window, num_heads: int):
    """``window`` -> None, an int >= 1, or a tuple of Hq ints >= 1 (per head; an int when all agree).

    Accepts None, an int, or a sequence / 1-D integer tensor with one window per query head.
    """
    if window is None or isinstance(window, bool):
        if window is not None:
            raise ValueError(f"window must be a positive int, one per head, or None, got {window!r}")
        return None
    if isinstance(window, int):
        if window < 1:
            raise ValueError(f"window must be a positive int or None, got {window!r}")
        return window
    if isinstance(window, torch.Tensor):
        window = check_window_tensor(window, None).tolist()
    try:
        per_head = tuple(int(w) for w in window)
        if any(w != x for w, x in zip(per_head, window)):
            raise TypeError
    except TypeError:
        raise ValueError(f"window must be a positive int, one int per head, or None, got {window!r}") from None
    if len(per_head) != num_heads or min(per_head) < 1:
        raise ValueError(f"window must hold one int >= 1 per query head ({num_heads}), got {list(per_head)}")
    return per_head[0] if len(set(per_head)) == 1 else per_head


def check_window_tensor(window: torch.Tensor, num_heads: int | None) -> torch.Tensor:
    """A window given as a tensor, its dtype and shape checked (not its values: no read of its data, so a
    compiled call carries it as a graph input into the op, which checks them with :func:`check_window`):
    a 1-D integer tensor, of ``num_heads`` entries unless None."""
    if window.dim() != 1 or window.is_floating_point() or window.is_complex():
        raise ValueError(f"window as a tensor must be a 1-D integer LongTensor[Hq], got {window.dtype} "
                         f"of shape {tuple(window.shape)}")
    if num_heads is not None and window.numel() != num_heads:
        raise ValueError(f"window must hold one int >= 1 per query head ({num_heads}), got a tensor of "
                         f"{window.numel()}")
    return window


def op_window(window: list[int], window_tensor: torch.Tensor | None, num_heads: int) -> list[int]:
    """The op's window as a list (:func:`window_list`): ``window``, or the values of ``window_tensor``
    checked (a CPU tensor's read on the host; a device tensor's read back, a sync)."""
    return window if window_tensor is None else window_list(check_window(window_tensor, num_heads))


def window_groups(window, num_heads: int) -> list[tuple[int | None, torch.Tensor]]:
    """``[(w, heads)]``: the query heads (CPU LongTensor) of each distinct window, narrowest
    first; one group of every head for None or an int."""
    if not isinstance(window, tuple):
        return [(window, torch.arange(num_heads))]
    per_head = torch.tensor(window)
    return [(int(w), torch.nonzero(per_head == w).flatten()) for w in sorted(set(window))]


def widest_window(window) -> int | None:
    """The largest window of any head (None: unbounded)."""
    return max(window) if isinstance(window, tuple) else window


def head_windows(window, num_heads: int) -> torch.Tensor:
    """LongTensor[num_heads]: each head's window (``window`` one int for all, or a tuple per head)."""
    return torch.tensor(window if isinstance(window, tuple) else [window] * num_heads, dtype=torch.int64)


def _key_range(q_pos, k_pos, i0: int, i1: int, causal: bool, window: int | None, docs=None) -> tuple[int, int]:
    """Keys [k0, k1) that queries [i0, i1) can see (positions increasing; ``docs`` =
    (q_doc, k_doc) non-decreasing document ids: keys of other documents are not seen)."""
    first, last = int(q_pos[i0]), int(q_pos[i1 - 1])
    k0 = 0 if window is None else int(torch.searchsorted(k_pos, first - window + 1))
    if causal:
        k1 = int(torch.searchsorted(k_pos, last, right=True))
    elif window is not None:
        k1 = int(torch.searchsorted(k_pos, last + window))
    else:
        k1 = k_pos.numel()
    if docs is not None:
        q_doc, k_doc = docs
        k0 = max(k0, int(torch.searchsorted(k_doc, q_doc[i0])))
        k1 = min(k1, int(torch.searchsorted(k_doc, q_doc[i1 - 1], right=True)))
    return k0, k1


def _bias(q_pos, k_pos, slopes, causal: bool, window: int | None, dtype, device, docs=None) -> torch.Tensor:
    """(1, Hq, C, K) additive bias: -m_h |p_i - p_j|, -inf for hidden keys (``docs``: the
    chunk's (q_doc, k_doc) ids; keys of another document are hidden)."""
    dist = (q_pos[:, None] - k_pos[None, :]).to(device)  # (C, K), signed: i - j
    bias = -slopes.to(device, torch.float32)[:, None, None] * dist.abs().to(torch.float32)[None]
    hidden = torch.zeros_like(dist, dtype=torch.bool)
    if causal:
        hidden |= dist < 0
    if window is not None:
        hidden |= dist.abs() >= window
    if docs is not None:
        hidden |= (docs[0][:, None] != docs[1][None, :]).to(device)
    return bias.masked_fill(hidden[None], float("-inf")).to(dtype)[None]


def _chunks(ranges: list[tuple[int, int]], chunk: int):
    """``(i0, i1)`` query chunks of at most ``chunk`` rows covering each range."""
    for r0, r1 in ranges:
        for i0 in range(r0, r1, chunk):
            yield i0, min(r1, i0 + chunk)


def _chunk_docs(docs, i0: int, i1: int, k0: int, k1: int):
    return None if docs is None else (docs[0][i0:i1], docs[1][k0:k1])


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, T, Hkv, D) -> (B, Hq, T, D) with each kv head repeated for its query heads."""
    return repeat_kv(x, groups).transpose(1, 2)


def alibi_forward(q, k, v, q_pos, k_pos, slopes, *, causal, window, scale, chunk, docs=None):
    """Chunked exact (windowed) ALiBi.

    Args:
        q: (B, Tq, Hq, D); k, v: (B, Tk, Hkv, D); q_pos LongTensor[Tq], k_pos
        LongTensor[Tk] on CPU, increasing; slopes Tensor[Hq].
        window: None, an int, or a tuple of one int per query head
            (:func:`check_window`); keys with ``|p_i - p_j| >= window_h`` are hidden.
        chunk: queries per chunk, or None for each window group's default
            (:func:`window_chunk_size`, :func:`default_chunk_size` without a window).
        docs: documents, ``(q_doc, k_doc)`` non-decreasing LongTensors [Tq], [Tk]
            of document ids (comparable between queries and keys); a query sees
            the keys of its own document only. With documents the positions are
            virtual (:attr:`~plsh_dist.ops.documents.Documents.virtual_positions`):
            increasing, and the real ones within a document.
    Returns:
        out (B, Tq, Hq, D) in q's dtype, lse (B, Hq, Tq) fp32 (fp64 for fp64).
    """
    kw = dict(causal=causal, scale=scale, docs=docs)
    if not isinstance(window, tuple):
        return _forward(q, k, v, q_pos, k_pos, slopes, window=window, chunk=_chunk(chunk, q, k, window), **kw)
    B, Tq, Hq, D = q.shape
    groups = Hq // k.shape[2]
    out = torch.empty(B, Tq, Hq, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, Hq, Tq, dtype=accum_dtype(q.dtype), device=q.device)
    for w, heads in window_groups(window, Hq):
        h, kv = heads.to(q.device), (heads // groups).to(q.device)
        # each query head with its own key/value head: the group is plain multi-head attention
        o, l = _forward(q[:, :, h], k[:, :, kv], v[:, :, kv], q_pos, k_pos, slopes[heads], window=w,
                        chunk=_chunk(chunk, q[:, :, h], k, w, per_head=True), **kw)
        out[:, :, h] = o
        lse[:, h] = l
    return out, lse


def _chunk(chunk: int | None, q, k, window: int | None, per_head: bool = False) -> int:
    """The given chunk, or the default for these heads and this window: the bias bound of
    :func:`default_chunk_size` for one window shared by every head, and
    :func:`window_chunk_size` for a group of heads of per-head windows."""
    if chunk is not None:
        return chunk
    if per_head:
        return window_chunk_size(q.shape[2], window, k.shape[1])
    return default_chunk_size(q.shape[2], k.shape[1] if window is None else min(k.shape[1], 2 * window))


def _band(q_pos, k_pos, slopes, causal, window, docs, dtype, device):
    """The interior of a windowed call on contiguous positions (:mod:`plsh_dist.ops.alibi_band`):
    ``(a, b, chunk, bias)``, or None when the loop computes every row."""
    T = q_pos.numel()
    if window is None or docs is not None or T != k_pos.numel() or T < 2:
        return None
    if int(q_pos[-1]) - int(q_pos[0]) != T - 1 or not torch.equal(q_pos, k_pos):
        return None  # gapped positions, or queries that are not the keys (decoding, SP halos)
    chunk = band_chunk(window)
    a, b = interior_rows(T, window, causal, chunk)
    if a == b:
        return None
    keys = chunk + (window - 1) * (1 if causal else 2)
    # relative positions: query r of a chunk at r + w - 1, its keys at 0 .. K - 1
    bias = _bias(torch.arange(chunk) + window - 1, torch.arange(keys), slopes, causal, window, dtype, device)
    return a, b, chunk, bias


def _loop_rows(Tq: int, band) -> list[tuple[int, int]]:
    """Row ranges the chunk loop computes: all of them, or those around the band's interior."""
    return [(0, Tq)] if band is None else [(0, band[0]), (band[1], Tq)]


def _forward(q, k, v, q_pos, k_pos, slopes, *, causal, window, scale, chunk, docs=None):
    """:func:`alibi_forward` with one window (None or an int) for every head."""
    B, Tq, Hq, D = q.shape
    groups = Hq // k.shape[2]
    k_h, v_h = _expand(k, groups), _expand(v, groups)  # (B, Hq, Tk, D)
    q_h = q.transpose(1, 2)
    out = torch.empty(B, Hq, Tq, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, Hq, Tq, dtype=accum_dtype(q.dtype), device=q.device)
    band = _band(q_pos, k_pos, slopes, causal, window, docs, q.dtype, q.device)
    if band is not None:
        a, b, band_c, bias = band
        out[:, :, a:b], lse[:, :, a:b] = banded_forward(q_h, k_h, v_h, bias, a=a, b=b, causal=causal, window=window,
                                                        scale=scale, chunk=band_c)
    for i0, i1 in _chunks(_loop_rows(Tq, band), chunk):
        k0, k1 = _key_range(q_pos, k_pos, i0, i1, causal, window, docs)
        bias = _bias(q_pos[i0:i1], k_pos[k0:k1], slopes, causal, window, q.dtype, q.device,
                     _chunk_docs(docs, i0, i1, k0, k1))
        o, l = dense_fwd(q_h[:, :, i0:i1], k_h[:, :, k0:k1], v_h[:, :, k0:k1], causal=False, scale=scale, bias=bias)
        out[:, :, i0:i1] = o
        lse[:, :, i0:i1] = l
    return out.transpose(1, 2), lse


def alibi_backward(dout, q, k, v, out, lse, q_pos, k_pos, slopes, *, causal, window, scale, chunk, docs=None):
    """Gradients of :func:`alibi_forward`, recomputing each chunk.

    Returns dq (B, Tq, Hq, D), dk, dv (B, Tk, Hkv, D) in the inputs' dtype.
    """
    kw = dict(causal=causal, scale=scale, docs=docs)
    if not isinstance(window, tuple):
        dq, dk, dv = _backward(dout, q, k, v, out, lse, q_pos, k_pos, slopes, window=window,
                               chunk=_chunk(chunk, q, k, window), **kw)
        return dq, dk.to(k.dtype), dv.to(v.dtype)
    Hq = q.shape[2]
    groups = Hq // k.shape[2]
    dq = torch.empty_like(q)
    dk = torch.zeros(k.shape, dtype=accum_dtype(k.dtype), device=k.device)
    dv = torch.zeros(v.shape, dtype=accum_dtype(v.dtype), device=v.device)
    for w, heads in window_groups(window, Hq):
        h, kv = heads.to(q.device), (heads // groups).to(q.device)
        dq_g, dk_g, dv_g = _backward(dout[:, :, h], q[:, :, h], k[:, :, kv], v[:, :, kv], out[:, :, h], lse[:, h],
                                     q_pos, k_pos, slopes[heads], window=w,
                                     chunk=_chunk(chunk, q[:, :, h], k, w, per_head=True), **kw)
        dq[:, :, h] = dq_g
        # query heads that share a key/value head add their gradients onto it
        dk.index_add_(2, kv, dk_g)
        dv.index_add_(2, kv, dv_g)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


def _backward(dout, q, k, v, out, lse, q_pos, k_pos, slopes, *, causal, window, scale, chunk, docs=None):
    """:func:`alibi_backward` with one window (None or an int) for every head; dk, dv in the
    accumulation dtype (the chunks' partial sums: the caller rounds them once)."""
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    acc = accum_dtype(q.dtype)
    k_h, v_h = _expand(k, groups), _expand(v, groups)
    q_h, out_h, dout_h = q.transpose(1, 2), out.transpose(1, 2), dout.transpose(1, 2)
    dq = torch.empty(B, Hq, Tq, D, dtype=q.dtype, device=q.device)
    dk = torch.zeros(B, Hq, Tk, D, dtype=acc, device=q.device)
    dv = torch.zeros(B, Hq, Tk, D, dtype=acc, device=q.device)
    band = _band(q_pos, k_pos, slopes, causal, window, docs, q.dtype, q.device)
    if band is not None:
        a, b, band_c, bias = band
        dq[:, :, a:b] = banded_backward(dout_h, q_h, k_h, v_h, out_h, lse, bias, a=a, b=b, causal=causal,
                                        window=window, scale=scale, chunk=band_c, dk=dk, dv=dv)
    for i0, i1 in _chunks(_loop_rows(Tq, band), chunk):
        k0, k1 = _key_range(q_pos, k_pos, i0, i1, causal, window, docs)
        bias = _bias(q_pos[i0:i1], k_pos[k0:k1], slopes, causal, window, q.dtype, q.device,
                     _chunk_docs(docs, i0, i1, k0, k1))
        dq_c, dk_c, dv_c = dense_bwd(
            dout_h[:, :, i0:i1], q_h[:, :, i0:i1], k_h[:, :, k0:k1], v_h[:, :, k0:k1],
            out_h[:, :, i0:i1], lse[:, :, i0:i1], causal=False, scale=scale, bias=bias, partial=True,
        )
        dq[:, :, i0:i1] = dq_c
        dk[:, :, k0:k1] += dk_c
        dv[:, :, k0:k1] += dv_c
    # Sum the repeated query heads back onto their key/value head.
    dk = sum_kv_repeats(dk, groups, dim=1).transpose(1, 2)
    dv = sum_kv_repeats(dv, groups, dim=1).transpose(1, 2)
    return dq.transpose(1, 2), dk, dv


def check_slopes(slopes, num_heads: int) -> torch.Tensor:
    """slopes -> float32 CPU Tensor[Hq], validated."""
    slopes = torch.as_tensor(slopes, dtype=torch.float32).reshape(-1).cpu()
    if slopes.numel() != num_heads:
        raise ValueError(
            f"slopes must have one entry per query head ({num_heads}), got {slopes.numel()}; "
            "use plsh_dist.hashing.alibi_slopes(num_heads)"
        )
    values = slopes.tolist()  # checked in Python: no torch op
    if not all(math.isfinite(m) and m >= 0 for m in values):
        raise ValueError(f"slopes must be finite and >= 0, got {values}")
    return slopes


def check_alibi_attention(q, k, v, slopes, positions, window, softmax_scale, chunk_size):
    """Validate the arguments of :func:`alibi_attention` (documents aside); ValueErrors name the argument.

    Returns ``(slopes, positions, scale, window)``: float32 CPU Tensor[Hq], CPU LongTensor[T],
    float, and the window as :func:`check_window` gives it.
    """
    check_qkv(q, k, v)
    slopes = check_slopes(slopes, q.shape[2])
    window = check_window(window, q.shape[2])
    pos = check_positions(positions, q.shape[1], q.device)
    scale = softmax_scale_for(q, softmax_scale)
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    return slopes, pos, scale, window


def alibi_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    slopes,
    positions: torch.Tensor | None = None,
    causal: bool = True,
    window: int | torch.Tensor | None = None,
    softmax_scale: float | None = None,
    chunk_size: int | None = None,
    return_lse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
):
    """Exact ALiBi attention (one process): logits ``q_i . k_j * scale - m_h |p_i - p_j|``.

    Args:
        q: (B, T, Hq, D); k, v: (B, T, Hkv, D), Hq % Hkv == 0.
        slopes: Tensor[Hq] of ALiBi slopes ``m_h`` (``alibi_slopes(Hq)``).
        positions: LongTensor[T] increasing absolute positions (default arange(T)).
        causal: keys after the query are hidden.
        window: sliding window: keys with ``|p_i - p_j| >= window_h`` are hidden; an
            int for every head, or a LongTensor[Hq] (or sequence) with one per head
            (truncated ALiBi, e.g. ``ceil(c / slopes)``: weights below ``e^-c`` dropped).
            A tensor's values are read and checked inside the op, so a compiled call
            (``fullgraph``) may take it as an input.
        chunk_size: queries per chunk (default: bias of a chunk under 64 MiB; per-head
            windows: sized by each head's window, :func:`window_chunk_size`). On CUDA with
            Triton (sm >= 80), a call without ``chunk_size`` runs on the fused
            banded kernel instead, each head over its own window's key tiles (every key for
            exact ALiBi): :func:`kernel_call`.
        return_lse: also return the log-sum-exp.
        cu_seqlens: packed documents, (num_docs + 1,) offsets over the flattened
            (B, T) batch, as :func:`plsh_dist.ops.plsh_attention`'s: a token
            sees its own document only; ``positions`` may be (B, T) and restart
            at document starts.
    Returns:
        out (B, T, Hq, D) in q's dtype; with ``return_lse`` also lse (B, Hq, T)
        fp32 (fp64 for fp64), not differentiable.
    """
    if isinstance(window, torch.Tensor):  # its values are checked inside the op: compiled, they are graph data
        window_tensor, window = check_window_tensor(window, q.shape[2]), []
    else:
        window_tensor, window = None, window_list(check_window(window, q.shape[2]))
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    out, lse = alibi_attention_op(q, k, v, positions, cu_seqlens, _slopes_tensor(slopes), window, causal,
                                  softmax_scale, chunk_size, choose_alibi_kernel(q.device, q.dtype, chunk_size),
                                  False, window_tensor)
    return (out, lse) if return_lse else out


def _slopes_tensor(slopes) -> torch.Tensor:
    """slopes as the custom op takes them: a tensor (validated inside the op, :func:`check_slopes`)."""
    return slopes if isinstance(slopes, torch.Tensor) else torch.as_tensor(slopes, dtype=torch.float32)


def window_list(window) -> list[int]:
    """A checked window as the custom op takes it: [] (None), [w] (every head) or one int per head."""
    if window is None:
        return []
    if isinstance(window, int):
        return [window]
    return [int(w) for w in (window.tolist() if isinstance(window, torch.Tensor) else window)]


def alibi_documents_call(q, k, v, slopes, positions, window, softmax_scale, chunk_size, cu_seqlens):
    """The checked arguments of :func:`alibi_forward` for packed documents: one flat row of B * T
    tokens, keys limited to each query chunk's documents (so no chunk ever sees another row).

    Returns ``(virtual positions, slopes, scale, window, chunk, document ids)`` (LongTensor[B * T] for
    positions and ids)."""
    slopes, _, scale, window = check_alibi_attention(q, k, v, slopes, None, window, softmax_scale, chunk_size)
    B, T = q.shape[:2]
    docs = flat_documents(positions, cu_seqlens, B, T)
    longest = int((docs.cu_seqlens[1:] - docs.cu_seqlens[:-1]).max())
    if isinstance(window, tuple):
        chunk = chunk_size  # per window group (alibi_forward)
    else:
        seen = longest if window is None else min(longest, 2 * window)
        chunk = chunk_size or default_chunk_size(q.shape[2], seen)
    return docs.virtual_positions, slopes, scale, window, chunk, docs.ids


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    causal: bool = True,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
):
    """Attention without positional bias (the model's own positions, e.g. rope,
    are applied to q, k before), one process: PyTorch SDPA, the exact-attention
    floor. SDPA returns no log-sum-exp, so ``return_lse=True`` runs exact
    attention in query chunks with zero ALiBi slopes instead (equal to
    rounding). So does ``cu_seqlens`` (packed documents, as
    :func:`alibi_attention`'s): SDPA would need a dense (T, T) mask.

    Shapes as :func:`alibi_attention`.
    """
    check_qkv(q, k, v)
    scale = softmax_scale_for(q, softmax_scale)
    if return_lse or cu_seqlens is not None:
        zero = torch.zeros(q.shape[2])
        return alibi_attention(q, k, v, slopes=zero, positions=positions, causal=causal, softmax_scale=scale,
                               return_lse=return_lse, cu_seqlens=cu_seqlens)
    check_positions(positions, q.shape[1], q.device)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    return out.transpose(1, 2)


# --- the custom op (layer 2; registrations shared with PLSH's: plsh_dist.ops.custom_ops) -------


def _alibi_call(q, k, v, positions, cu_seqlens, slopes, window, softmax_scale, chunk_size, from_position_ids):
    """The arguments of :func:`~plsh_dist.ops.alibi_forward` / ``alibi_backward``:
    ``(q_pos, k_pos, slopes, dict(window, scale, chunk, docs))`` and whether documents flatten the call."""
    positions, cu_seqlens = host_layout(positions, cu_seqlens, q, from_position_ids)
    win = None if not window else window[0] if len(window) == 1 else tuple(window)
    if cu_seqlens is None:
        slopes, pos, scale, win = check_alibi_attention(q, k, v, slopes, positions, win, softmax_scale,
                                                              chunk_size)
        return pos, slopes, dict(window=win, scale=scale, chunk=chunk_size), False
    pos, slopes, scale, win, chunk, doc_ids = alibi_documents_call(q, k, v, slopes, positions, win,
                                                                          softmax_scale, chunk_size, cu_seqlens)
    return pos, slopes, dict(window=win, scale=scale, chunk=chunk, docs=(doc_ids, doc_ids)), True


def kernel_call(q, k, v, positions, cu_seqlens, slopes, window: list[int], causal: bool, softmax_scale, kernel: str,
                from_position_ids):
    """``(kernel bias, scale)`` of the fused kernel for an op call, or None where the chunked path runs it
    (``kernel``: :func:`~plsh_dist.ops.alibi_kernel.choose_alibi_kernel`'s answer). With documents the kernel
    bias's layout is the flat row's (the call runs on it: :class:`BatchRows`).

    Reads no device data where the models call it: raw ``position_ids`` and packed offsets on the device
    stay there (:func:`~plsh_dist.ops.layout.device_layout`); the slopes and windows are host constants,
    checked on the host and copied to the device once (:func:`~plsh_dist.ops.triton.cache.device_constant`).
    Exact ALiBi is the window :data:`UNBOUNDED_WINDOW`; zero slopes (no bias) give ``sigma = inf``. The
    kernel's tables are built on the device (``KernelBias.of(..., by="kernels")``)."""
    if kernel != AlibiKernel.FUSED:
        return None
    check_qkv(q, k, v)
    (B, T, Hq), device = q.shape[:3], q.device
    on_device = device_layout(positions, cu_seqlens, q, from_position_ids)
    if on_device is not None:
        pos, layout = on_device
        layout = layout or TokenLayout.build(pos, device)
    else:
        positions, cu_seqlens = host_layout(positions, cu_seqlens, q, from_position_ids)
        if cu_seqlens is None:
            layout = TokenLayout.build(check_positions(positions, T, device), device)
        else:
            docs = flat_documents(positions, cu_seqlens, B, T)
            layout = TokenLayout.build(docs.positions, device, docs)

    def bias() -> WindowBias:
        win = check_window(None if not window else window[0] if len(window) == 1 else tuple(window), Hq)
        sigma = [1 / m if m else math.inf for m in check_slopes(slopes, Hq).tolist()]  # in Python: no torch op
        return WindowBias(torch.tensor(sigma).to(device), head_windows(win or UNBOUNDED_WINDOW, Hq).to(device))

    key = ("alibi window bias", str(device), Hq, tuple(window), *host_key(slopes.cpu()))
    kb = KernelBias.of(device_constant(key, bias), layout, causal, fused.kernel_tiles(q), by="kernels")
    return kb, softmax_scale_for(q, softmax_scale)


@torch.library.custom_op(f"{NAMESPACE}::alibi_attention", mutates_args=())
def alibi_attention_op(q: Tensor, k: Tensor, v: Tensor, positions: Tensor | None, cu_seqlens: Tensor | None,
                    slopes: Tensor, window: list[int], causal: bool, softmax_scale: float | None,
                    chunk_size: int | None, kernel: str, from_position_ids: bool,
                    window_tensor: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Exact ALiBi (``window``: [] none, [w] one for every head, or one per head; or ``window_tensor``,
    LongTensor[Hq] with ``window`` [], checked here): ``(out, lse)`` of :func:`plsh_dist.ops.alibi_attention`,
    on the kernel the caller chose (``kernel``: :func:`~plsh_dist.ops.alibi_kernel.choose_alibi_kernel`'s
    answer): the fused one (:func:`kernel_call`) or query chunks."""
    window = op_window(window, window_tensor, q.shape[2])
    kernel = kernel_call(q, k, v, positions, cu_seqlens, slopes, window, causal, softmax_scale, kernel,
                         from_position_ids)
    if kernel is not None:
        kb, scale = kernel
        rows = BatchRows.of(q, kb.layout.doc is not None)
        out, lse = rows.outputs(*fused.banded_forward(*rows.inputs(q, k, v), kb.bias, kb.layout,
                                                               causal=causal, scale=scale, kernel_bias=kb))
        return out.contiguous(), lse.contiguous()
    pos, slopes, kw, flat = _alibi_call(q, k, v, positions, cu_seqlens, slopes, window, softmax_scale, chunk_size,
                                        from_position_ids)
    rows = BatchRows.of(q, flat)
    out, lse = rows.outputs(*alibi_forward(*rows.inputs(q, k, v), pos, pos, slopes, causal=causal, **kw))
    return out.contiguous(), lse.contiguous()


@alibi_attention_op.register_fake
def _(q, k, v, *_params):
    return fake_forward(q)


@torch.library.custom_op(f"{NAMESPACE}::alibi_attention_backward", mutates_args=())
def alibi_attention_op_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             positions: Tensor | None, cu_seqlens: Tensor | None, slopes: Tensor,
                             window: list[int], causal: bool, softmax_scale: float | None, chunk_size: int | None,
                             kernel: str, from_position_ids: bool, window_tensor: Tensor | None = None
                             ) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`alibi_attention_op`, on the forward's kernel: the fused kernel's backward,
    or each query chunk recomputed."""
    window = op_window(window, window_tensor, q.shape[2])
    kernel = kernel_call(q, k, v, positions, cu_seqlens, slopes, window, causal, softmax_scale, kernel,
                         from_position_ids)
    if kernel is not None:
        kb, scale = kernel
        rows = BatchRows.of(q, kb.layout.doc is not None)
        grads = fused.banded_backward(*rows.inputs(dout, q, k, v, out), rows.lse_input(lse), kb.bias,
                                               kb.layout, causal=causal, scale=scale, kernel_bias=kb)
        return tuple(g.contiguous() for g in rows.grads(grads))
    pos, slopes, kw, flat = _alibi_call(q, k, v, positions, cu_seqlens, slopes, window, softmax_scale, chunk_size,
                                        from_position_ids)
    rows = BatchRows.of(q, flat)
    grads = alibi_backward(*rows.inputs(dout, q, k, v, out), rows.lse_input(lse), pos, pos, slopes, causal=causal,
                           **kw)
    return tuple(g.contiguous() for g in rows.grads(grads))


@alibi_attention_op_backward.register_fake
def _(dout, q, k, v, *_params):
    return fake_backward(q, k, v)


register_autograd(alibi_attention_op, alibi_attention_op_backward)
