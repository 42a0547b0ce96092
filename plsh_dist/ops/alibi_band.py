"""Windowed exact ALiBi on contiguous positions: many query chunks per dense call.

With contiguous positions and one window ``w`` for a group of heads, every
query chunk ``[i0, i0 + C)`` whose keys ``[i0 - (w - 1), i0 + C)`` (non-causal:
``+ (w - 1)`` more) lie inside the sequence sees the same relative
positions, so one bias (Hc, C, K) serves all of them. These *interior*
chunks are stacked along the batch axis and run in a few dense calls (keys
gathered by ``unfold``), instead of one call per chunk: for narrow windows
(truncated ALiBi's small-sigma heads) the loop's per-call overhead dominated
the few keys each query reads. The chunks at the ends, whose keys leave the
sequence, stay with the caller's loop (:mod:`plsh_dist.ops.alibi`).

The keys of chunk ``g`` start at ``g C`` in the slice ``[a - P, b + P_r)``
(``P = w - 1`` before, ``P_r`` = 0 causal, else ``P`` after), so backward adds
each chunk's dK, dV back at those offsets (``index_add_``).

Legend: B batch, Hc heads of the group, n interior queries, C queries per
chunk, G chunks, K = C + P + P_r keys per chunk, D head dim.
"""

from __future__ import annotations

import torch

from plsh_dist.ops.dense import dense_bwd, dense_fwd

#: Elements of one call's scores (B G Hc C K, fp32): a few of these live at once.
_CALL_ELEMENTS = 16 * 2**20


def band_chunk(window: int) -> int:
    """Queries per chunk for window ``w``: a multiple of 16 near ``w / 2`` (each query reads
    ``C + w`` keys for ``w`` useful ones; the chunks share calls, so small chunks are cheap)."""
    return max(16, -(-window // 32) * 16)


def interior_rows(T: int, window: int, causal: bool, chunk: int) -> tuple[int, int]:
    """Query rows ``[a, b)`` made of whole chunks whose keys all lie in ``[0, T)`` (``a == b``: none)."""
    P = window - 1
    right = 0 if causal else P
    first = -(-P // chunk)  # chunks start at multiples of ``chunk``
    last = (T - chunk - right) // chunk  # the last chunk g with g C + C + right <= T
    if last < first:
        return 0, 0
    return first * chunk, (last + 1) * chunk


def _num_keys(chunk: int, window: int, causal: bool) -> int:
    return chunk + (window - 1) * (1 if causal else 2)


def _calls(B: int, H: int, G: int, chunk: int, K: int):
    """Chunk ranges [g0, g1) of each dense call, within the call budget."""
    per = max(1, _CALL_ELEMENTS // max(1, B * H * chunk * K))
    return [(g0, min(G, g0 + per)) for g0 in range(0, G, per)]


def _stack_queries(x_h: torch.Tensor, g0: int, g1: int, a: int, chunk: int) -> torch.Tensor:
    """(B, H, T, D) rows of chunks [g0, g1) of the interior -> (B (g1 - g0), H, C, D)."""
    B, H, _, D = x_h.shape
    rows = x_h[:, :, a + g0 * chunk : a + g1 * chunk].reshape(B, H, g1 - g0, chunk, D)
    return rows.transpose(1, 2).reshape(B * (g1 - g0), H, chunk, D)


def _stack_keys(x_h: torch.Tensor, g0: int, g1: int, a: int, chunk: int, window: int, K: int) -> torch.Tensor:
    """(B, H, T, D) keys of chunks [g0, g1) -> (B (g1 - g0), H, K, D) (a copy: chunks overlap)."""
    B, H, _, D = x_h.shape
    start = a + g0 * chunk - (window - 1)
    span = x_h[:, :, start : start + (g1 - g0 - 1) * chunk + K]
    keys = span.unfold(2, K, chunk)  # (B, H, g1 - g0, D, K)
    return keys.permute(0, 2, 1, 4, 3).reshape(B * (g1 - g0), H, K, D)


def _unstack(x: torch.Tensor, B: int) -> torch.Tensor:
    """(B G, H, C, ...) -> (B, H, G C, ...)."""
    G = x.shape[0] // B
    x = x.reshape(B, G, *x.shape[1:]).transpose(1, 2)
    return x.reshape(B, x.shape[1], G * x.shape[3], *x.shape[4:])


def banded_forward(q_h, k_h, v_h, bias, *, a: int, b: int, causal: bool, window: int, scale: float, chunk: int):
    """Interior rows ``[a, b)`` of windowed ALiBi.

    Args:
        q_h: (B, H, Tq, D); k_h, v_h: (B, H, Tk, D) with the queries at the same contiguous
            positions as the keys; bias: (1, H, C, K) of a chunk against its keys, shared by all.
    Returns:
        out (B, H, b - a, D) in q's dtype, lse (B, H, b - a).
    """
    B, H = q_h.shape[:2]
    K = _num_keys(chunk, window, causal)
    outs, lses = [], []
    for g0, g1 in _calls(B, H, (b - a) // chunk, chunk, K):
        o, l = dense_fwd(_stack_queries(q_h, g0, g1, a, chunk), _stack_keys(k_h, g0, g1, a, chunk, window, K),
                         _stack_keys(v_h, g0, g1, a, chunk, window, K), causal=False, scale=scale, bias=bias)
        outs.append(_unstack(o, B))
        lses.append(_unstack(l, B))
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def banded_backward(dout_h, q_h, k_h, v_h, out_h, lse, bias, *, a: int, b: int, causal: bool, window: int,
                    scale: float, chunk: int, dk: torch.Tensor, dv: torch.Tensor) -> torch.Tensor:
    """Gradients of :func:`banded_forward`: returns dq (B, H, b - a, D) in the accumulation dtype;
    adds dK, dV into ``dk``, ``dv`` (B, H, Tk, D), the caller's accumulators (in the
    accumulation dtype: the chunks' partial gradients are not rounded before their sum).

    ``dout_h``, ``out_h`` (B, H, Tq, D) and ``lse`` (B, H, Tq) are the whole rows' (the
    merged output's, as :func:`~plsh_dist.ops.dense.dense_bwd` needs).
    """
    B, H = q_h.shape[:2]
    K = _num_keys(chunk, window, causal)
    dqs = []
    for g0, g1 in _calls(B, H, (b - a) // chunk, chunk, K):
        G = g1 - g0
        rows = (a + g0 * chunk, a + g1 * chunk)
        dq_c, dk_c, dv_c = dense_bwd(
            _stack_queries(dout_h, g0, g1, a, chunk), _stack_queries(q_h, g0, g1, a, chunk),
            _stack_keys(k_h, g0, g1, a, chunk, window, K), _stack_keys(v_h, g0, g1, a, chunk, window, K),
            _stack_queries(out_h, g0, g1, a, chunk),
            lse[:, :, rows[0] : rows[1]].reshape(B, H, G, chunk).transpose(1, 2).reshape(B * G, H, chunk),
            causal=False, scale=scale, bias=bias, partial=True,
        )
        dqs.append(_unstack(dq_c, B))
        # key c of chunk g sits at start + g C + c
        start = rows[0] - (window - 1)
        index = (torch.arange(G)[:, None] * chunk + torch.arange(K)[None, :]).flatten().to(dk.device) + start
        for acc, grad in ((dk, dk_c), (dv, dv_c)):
            grad = grad.reshape(B, G, H, K, -1).transpose(1, 2).reshape(B, H, G * K, -1)
            acc.index_add_(2, index, grad.to(acc.dtype))
    return torch.cat(dqs, dim=2)
