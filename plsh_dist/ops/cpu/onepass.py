"""PLSH in one pass: the s-sample merge as one attention with integer weights.

``T~ = softmax(q k^T scale + log c) v`` with ``c_ij = #{t : bucket_t(i) == bucket_t(j)}`` (and
``j <= i`` when causal) equals the per-sample merge of :mod:`plsh_dist.ops.plsh` up to rounding;
its keys form one band per query, about ``sigma (ln s + 0.58)`` keys back, so the cost grows like
log s and nothing per sample is stored. Queries run per hash head in chunks, padded into batched
dense calls within :data:`CALL_BUDGET`; the bias is a cumulative sum of +1 / -1 at the block
bounds (no bucket-id compares), from :meth:`PositionalLSH.block_bounds` per call (no (s, n)
table); backward recomputes it. The derivation, the layout and the costs: docs/design.md,
section 1, "The one-pass form".

Legend: B batch, n tokens, Hq / Hkv query / key-value heads, D head dim,
s samples, Hc heads of one hash head (Hq shared, 1 per-head), G chunks in
one call, C queries per chunk, K keys per chunk of the call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.cpu.band import log_count_bias
from plsh_dist.ops.dense import DenseKernel, dense_bwd, dense_fwd
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.gqa import sum_kv_repeats
from plsh_dist.ops.head_groups import group_inputs, head_groups
from plsh_dist.ops.merge import accum_dtype
from plsh_dist.ops.strategy import Strategy

#: Elements of one call's (Hc * B, G, C, K) logits plus its per-sample block
#: bounds ((s, G * C) int64 tables, a few at a time: counted as 16 elements per
#: query and sample): bounds the memory of a call whatever s (exceeded only by
#: one chunk of 16 queries whose band spans more keys than this allows).
CALL_BUDGET = 1 << 22
_BOUNDS_ELEMENTS_PER_SAMPLE = 16
#: Queries per chunk: the band times this, rounded up to a multiple of 16 in [16, 512].
_CHUNK_PER_BAND = 1.0


def chunk_size_for_band(band: float) -> int:
    """Queries per chunk for a head whose mean band is ``band`` keys: a multiple of
    16 in [16, 512], so small-sigma heads do not pay for big chunks (each
    query wastes about C / 2 keys of its chunk's rectangle)."""
    c = int(math.ceil(_CHUNK_PER_BAND * band / 16.0)) * 16
    return max(16, min(512, c))


@dataclass(frozen=True)
class _Call:
    """One batched dense call: G chunks of C queries against K keys each.

    Attributes:
        q_idx: LongTensor (G, C), token of every query slot (padding: the last real token).
        q_real: number of real query slots (a prefix of the flattened (G, C) slots).
        k_idx: LongTensor (G, K), token of every key slot (clamped into range).
        k0: LongTensor (G,), first key of each chunk.
    """

    q_idx: torch.Tensor
    q_real: int
    k_idx: torch.Tensor
    k0: torch.Tensor


def token_bounds(lsh: PositionalLSH, head: int, positions: torch.Tensor, tokens: torch.Tensor, causal: bool,
                  docs: Documents | None = None):
    """First token (s, m) of the block of each of ``tokens`` (LongTensor[m] of token
    indices) in every sample of hash head ``head``, and one past its last token
    (s, m), or None when causal. From the hash's own block bounds at those
    positions: O(s m), no table over the whole sequence.

    With ``docs`` each block is also cut to its token's document: positions are
    found in the row's strictly increasing virtual positions (the document's own
    shifted by a constant), and the bounds clamped to the document."""
    first_pos, end_pos = lsh.block_bounds(positions[tokens], head, ends=not causal)
    if docs is None:
        return _token_of(positions, first_pos), None if causal else _token_of(positions, end_pos)
    vpos, off = docs.virtual_positions, docs.offset[tokens]
    first = torch.maximum(_token_of(vpos, first_pos + off), docs.first[tokens])
    end = None if causal else torch.minimum(_token_of(vpos, end_pos + off), docs.end[tokens])
    return first, end


def _token_of(positions: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Index of the first token at or after each position ``p`` (the number of tokens before it).

    Contiguous positions (one process, or one rank's chunk) need no search.
    """
    n = positions.numel()
    first = int(positions[0])
    if int(positions[-1]) - first == n - 1:
        return (p - first).clamp_(0, n)
    return torch.searchsorted(positions, p)


def _chunk_size(lsh: PositionalLSH, head: int, positions: torch.Tensor, docs: Documents | None = None) -> int:
    """Chunk size of one hash head from its mean band (keys back to the earliest
    block start), measured at up to 1024 evenly spaced tokens."""
    n = positions.numel()
    probe = torch.linspace(0, n - 1, min(n, 1024)).round().long()
    first, _ = token_bounds(lsh, head, positions, probe, causal=True, docs=docs)
    band = float((probe - first.min(dim=0).values).double().mean()) + 1.0
    return chunk_size_for_band(band)


def _chunk_bounds(lsh, head, positions, causal, chunk: int, docs: Documents | None = None):
    """Queries ``[starts, stops)`` of every chunk, its first key and key count, LongTensors (nc,)."""
    n = positions.numel()
    starts = torch.arange(0, n, chunk)
    stops = torch.clamp(starts + chunk, max=n)
    # block bounds are monotone in the token (documents too), so the first and last queries bound the chunk
    k0 = token_bounds(lsh, head, positions, starts, causal=True, docs=docs)[0].min(dim=0).values
    k1 = stops if causal else \
        token_bounds(lsh, head, positions, stops - 1, causal=False, docs=docs)[1].max(dim=0).values
    return starts, stops, k0, k1 - k0


def _calls(lsh: PositionalLSH, head: int, positions: torch.Tensor, causal: bool, heads_batch: int,
           docs: Documents | None = None) -> list[_Call]:
    """Chunks of one hash head, grouped into calls within :data:`CALL_BUDGET`.

    ``heads_batch``: B times the query heads of the hash head (the call's
    (B * Hc) axis). A chunk whose own logits would exceed the budget (a band as
    long as the sequence) is halved down to 16 queries first.
    """
    n = positions.numel()
    per_query = _BOUNDS_ELEMENTS_PER_SAMPLE * lsh.num_samples  # block-bounds tables, per query

    def cost(num_chunks: int, width: int) -> int:  # elements of one call's working memory
        return num_chunks * chunk * (heads_batch * width + per_query)

    chunk = _chunk_size(lsh, head, positions, docs)
    starts, stops, k0, widths = _chunk_bounds(lsh, head, positions, causal, chunk, docs)
    while chunk > 16 and cost(1, int(widths.max())) > CALL_BUDGET:
        chunk = max(16, chunk // 2 // 16 * 16)
        starts, stops, k0, widths = _chunk_bounds(lsh, head, positions, causal, chunk, docs)
    widths = widths.tolist()
    calls, first = [], 0
    nc = starts.numel()
    while first < nc:
        last, width = first + 1, widths[first]
        while last < nc and cost(last + 1 - first, max(width, widths[last])) <= CALL_BUDGET:
            width = max(width, widths[last])
            last += 1
        q = torch.arange(int(starts[first]), int(starts[first]) + (last - first) * chunk)
        q_real = min(n, int(stops[last - 1])) - int(starts[first])
        q_idx = q.clamp(max=n - 1).view(last - first, chunk)
        k_idx = (k0[first:last, None] + torch.arange(width)[None, :]).clamp(max=n - 1)
        calls.append(_Call(q_idx, q_real, k_idx, k0[first:last]))
        first = last
    return calls


def count_bias(call: _Call, lsh: PositionalLSH, head: int, positions: torch.Tensor, causal: bool,
               dtype: torch.dtype, docs: Documents | None = None) -> torch.Tensor:
    """Additive bias ``log c_ij`` of one call, (G, 1, C, K) in ``dtype`` (``-inf`` where c = 0):
    :func:`plsh_dist.ops.cpu.band.log_count_bias` of the call's queries' block bounds."""
    G, C = call.q_idx.shape
    s = lsh.num_samples
    first, end = token_bounds(lsh, head, positions, call.q_idx.flatten(), causal, docs)  # (s, G * C)
    rel = (first.view(s, G, C) - call.k0[None, :, None]).permute(1, 2, 0)  # (G, C, s) in [0, K)
    if causal:  # every sample's block is cut just after the query
        stop, weight = (call.q_idx - call.k0[:, None] + 1)[..., None], float(s)  # (G, C, 1)
    else:
        stop, weight = (end.view(s, G, C) - call.k0[None, :, None]).permute(1, 2, 0), 1.0
    return log_count_bias(rel, stop, weight, call.k_idx.shape[1], dtype)[:, None]


def _gather_queries(x_BnHD: torch.Tensor, call: _Call, zero_pads: bool = False) -> torch.Tensor:
    """(B, n, Hc, D) -> (G, B * Hc, C, D): the call's query slots, batch and heads folded.

    ``zero_pads``: padding slots hold zeros instead of the last real token
    (needed for dout only: a padding query must not add to dk, dv).
    """
    B, _, Hc, D = x_BnHD.shape
    G, C = call.q_idx.shape
    x = x_BnHD.index_select(1, call.q_idx.flatten().to(x_BnHD.device)).view(B, G, C, Hc, D)
    x = x.permute(1, 0, 3, 2, 4).reshape(G, B * Hc, C, D)
    if zero_pads and call.q_real < G * C:
        real = (torch.arange(G * C, device=x.device) < call.q_real).view(G, 1, C, 1)
        x = x.masked_fill(~real, 0)
    return x


def _gather_keys(x_BnHD: torch.Tensor, call: _Call) -> torch.Tensor:
    """(B, n, Hc, D) -> (G, B * Hc, K, D)."""
    B, _, Hc, D = x_BnHD.shape
    G, K = call.k_idx.shape
    x = x_BnHD.index_select(1, call.k_idx.flatten().to(x_BnHD.device)).view(B, G, K, Hc, D)
    return x.permute(1, 0, 3, 2, 4).reshape(G, B * Hc, K, D)


def _scatter_queries(dst_BnHD: torch.Tensor, x_GNCD: torch.Tensor, call: _Call) -> None:
    """Write the call's real query rows (G, B * Hc, C, D) into ``dst`` (B, n, Hc, D)."""
    B, _, Hc, D = dst_BnHD.shape
    G, C = call.q_idx.shape
    x = x_GNCD.view(G, B, Hc, C, D).permute(1, 0, 3, 2, 4).reshape(B, G * C, Hc, D)[:, : call.q_real]
    dst_BnHD[:, int(call.q_idx[0, 0]) : int(call.q_idx[0, 0]) + call.q_real] = x


def _add_keys(dst_BnHD: torch.Tensor, x_GNKD: torch.Tensor, call: _Call) -> None:
    """Add the call's key-slot gradients (G, B * Hc, K, D) into ``dst`` (B, n, Hc, D)."""
    B, _, Hc, D = dst_BnHD.shape
    G, K = call.k_idx.shape
    x = x_GNKD.view(G, B, Hc, K, D).permute(1, 0, 3, 2, 4).reshape(B, G * K, Hc, D)
    dst_BnHD.index_add_(1, call.k_idx.flatten().to(dst_BnHD.device), x.to(dst_BnHD.dtype))


def _head_calls(lsh: PositionalLSH, positions: torch.Tensor, causal: bool, B: int, Hq: int, Hkv: int,
                docs: Documents | None):
    """Per hash head: (its :class:`~plsh_dist.ops.head_groups.HeadGroup`, its calls). Forward
    and backward build them alike: they are cheap (O(s) per chunk), and keeping them between the two
    would hold O(n) indices per hash head and layer."""
    heads = head_groups(lsh, Hq, Hkv)
    heads_batch = B * (Hq if heads.shared else 1)
    for g in heads.groups:
        yield g, _calls(lsh, g.hash_head, positions, causal, heads_batch, docs)


def onepass_forward(q, k, v, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool, scale: float,
                    kernel: DenseKernel = DenseKernel.AUTO, docs: Documents | None = None):
    """One-pass PLSH forward.

    q: (B, n, Hq, D); k, v: (B, n, Hkv, D); positions CPU LongTensor[n], increasing
    (within each document of ``docs``, a batch-1 call's documents).
    Returns out (B, n, Hq, D) in q's dtype, lse (B, Hq, n) fp32 (fp64 for fp64).
    """
    B, n, Hq, D = q.shape
    Hkv = k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty(B, n, Hq, 1, dtype=accum_dtype(q.dtype), device=q.device)  # heads-last, like out
    for g, calls in _head_calls(lsh, positions, causal, B, Hq, Hkv, docs):
        q_h, k_h, v_h = group_inputs(q, k, v, g)
        out_h = out[:, :, g.q_heads]
        lse_h = lse[:, :, g.q_heads]
        for call in calls:
            bias = count_bias(call, lsh, g.hash_head, positions, causal, q.dtype, docs).to(q.device)
            o, l = dense_fwd(_gather_queries(q_h, call), _gather_keys(k_h, call), _gather_keys(v_h, call),
                             causal=False, scale=scale, bias=bias, kernel=kernel)
            _scatter_queries(out_h, o, call)
            _scatter_queries(lse_h, l[..., None], call)
    return out, lse[..., 0].permute(0, 2, 1).contiguous()


def onepass_backward(dout, q, k, v, out, lse, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool,
                     scale: float, kernel: DenseKernel = DenseKernel.AUTO, docs: Documents | None = None):
    """Gradients of :func:`onepass_forward` given the merged ``out`` and ``lse``.

    Returns dq (B, n, Hq, D), dk, dv (B, n, Hkv, D) in the inputs' dtype.
    """
    B, n, Hq, D = q.shape
    Hkv = k.shape[2]
    acc = accum_dtype(q.dtype)
    dq = torch.empty_like(q)
    heads = head_groups(lsh, Hq, Hkv)
    dk = torch.zeros(B, n, Hq if heads.shared else Hkv, D, dtype=acc, device=q.device)
    dv = torch.zeros_like(dk)
    lse_BnH1 = lse.permute(0, 2, 1)[..., None]
    for g, calls in _head_calls(lsh, positions, causal, B, Hq, Hkv, docs):
        q_h, k_h, v_h = group_inputs(q, k, v, g)
        # contiguous once per head: index_select from a strided view costs O(n) per call
        dout_h, out_h, lse_h = (x[:, :, g.q_heads].contiguous() for x in (dout, out, lse_BnH1))
        kv_slot = g.q_heads if heads.shared else slice(g.kv_head, g.kv_head + 1)
        for call in calls:
            bias = count_bias(call, lsh, g.hash_head, positions, causal, q.dtype, docs).to(q.device)
            dq_c, dk_c, dv_c = dense_bwd(
                _gather_queries(dout_h, call, zero_pads=True), _gather_queries(q_h, call), _gather_keys(k_h, call),
                _gather_keys(v_h, call), _gather_queries(out_h, call), _gather_queries(lse_h, call)[..., 0],
                causal=False, scale=scale, bias=bias, kernel=kernel, partial=True,
            )
            _scatter_queries(dq[:, :, g.q_heads], dq_c, call)
            _add_keys(dk[:, :, kv_slot], dk_c, call)
            _add_keys(dv[:, :, kv_slot], dv_c, call)
    if heads.shared:  # kv heads were repeated to the query heads: sum each group back
        dk, dv = sum_kv_repeats(dk, heads.kv_repeat), sum_kv_repeats(dv, heads.kv_repeat)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


@dataclass(frozen=True)
class OnePass(Strategy):
    """Strategy: the s samples as one attention with the bias ``log c_ij``, in query chunks on dense calls.

    ``kernel``: the dense calls' (``AUTO``: per call by key length; ``MATH``: explicit matmuls).
    """

    kernel: DenseKernel = DenseKernel.AUTO
    onepass = True

    def forward(self, q, k, v, lsh, positions, *, causal, scale, docs=None):
        """``(out, lse, saved)``; ``saved`` is None (the calls are recomputed in backward, see ``_head_calls``)."""
        return (*onepass_forward(q, k, v, lsh, positions, causal=causal, scale=scale, kernel=self.kernel,
                                 docs=docs), None)

    def backward(self, dout, q, k, v, out, lse, lsh, positions, *, causal, scale, docs=None, saved=None):
        """``(dq, dk, dv)``."""
        return onepass_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale,
                                kernel=self.kernel, docs=docs)
