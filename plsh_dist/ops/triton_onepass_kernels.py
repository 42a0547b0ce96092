"""Triton kernels of the one-pass estimator: ``softmax(q k^T scale + bias) v`` over banded tiles.

Imported only where Triton is importable (:mod:`plsh_dist.ops.triton_onepass`
launches them). Scores are in base 2 (``exp2`` / ``log2``: no libdevice, so
Triton's CPU interpreter runs the same code).

Bias of one (query tile, key tile), :func:`_bias_tile` (shared by every kernel):

- ``MODE == 0``, count: ``log2 c_ij``, ``c_ij = #{t : bucket_t(p_i) == bucket_t(p_j)}``
  with ``bucket = floor((p - shift) / pitch)`` in float64, the exact arithmetic
  of :func:`plsh_dist.hashing._bucket` (IEEE division, ``div.rn.f64`` on the GPU),
  so the kernel's blocks are the hash's bit for bit;
- ``MODE == 1``, ALiBi window: ``-|p_i - p_j| / sigma_h * log2(e)`` where
  ``|p_i - p_j| < window_h``.

Hidden (``-inf``): keys past the sequence, other documents, ``j > i`` when
causal, ``c = 0``. A row with only hidden keys in a tile adds nothing and
produces no NaN (its running max stays ``-inf`` and exponentials use 0).

Layouts: q, dq, out, dout (B, n, Hq, D); k, v, dk, dv (B, n, Hkv, D), any
strides with a unit last one; lse and delta (B, Hq, n) fp32; positions
int64[n]; documents int32[n]; pitch, shift float64[s, Hh]; sigma
float32[Hh], window int64[Hh]; bands int32[Hh, tiles].
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["onepass_fwd_kernel", "onepass_bwd_dkdv_kernel", "onepass_bwd_dq_kernel", "count_tile_kernel"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr):
    """(BM, BN) True where key j may be seen by query i at all: in range, causal, same document."""
    visible = (offs_m[:, None] < n_tokens) & (offs_n[None, :] < n_tokens)
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None])
    if HAS_DOCS:
        visible = visible & (doc_m[:, None] == doc_n[None, :])
    return visible


@triton.jit
def _count_tile(offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples, Pitch, Shift,
                CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr):
    """(BM, BN) int32 ``c_ij`` (0 where hidden): samples whose bucket holds both positions,
    ``floor((p - shift) / pitch)`` in float64 as :func:`plsh_dist.hashing._bucket`."""
    pq = pos_m.to(tl.float64)
    pk = pos_n.to(tl.float64)
    count = tl.zeros([offs_m.shape[0], offs_n.shape[0]], dtype=tl.int32)
    for t in range(0, num_samples):
        pitch = tl.load(Pitch + t * num_hh + hh)
        shift = tl.load(Shift + t * num_hh + hh)
        bq = tl.floor((pq - shift) / pitch)
        bk = tl.floor((pk - shift) / pitch)
        count += (bq[:, None] == bk[None, :]).to(tl.int32)
    return tl.where(_visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL, HAS_DOCS), count, 0)


@triton.jit
def _bias_tile(offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
               Pitch, Shift, Sigma, Window,
               MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr):
    """(BM, BN) additive bias in log2 units, ``-inf`` where hidden (module doc)."""
    if MODE == 0:
        count = _count_tile(offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
                            Pitch, Shift, CAUSAL, HAS_DOCS)
        visible = count > 0
        bias = tl.log2(tl.maximum(count, 1).to(tl.float32))
    else:
        dist = tl.abs(pos_m[:, None] - pos_n[None, :])
        visible = _visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL, HAS_DOCS) & (dist < tl.load(Window + hh))
        bias = dist.to(tl.float32) * (-LOG2E / tl.load(Sigma + hh))
    return tl.where(visible, bias, float("-inf"))


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """fp32 accumulation; IEEE fp32 products for fp32 inputs (no TF32 rounding)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def onepass_fwd_kernel(
    Q, K, V, Out, Lse, Pos, Doc, Pitch, Shift, Sigma, Window, BandLo, BandHi,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ob, stride_ot, stride_oh,
    n_tokens, num_q_heads, group, num_hh, num_samples, num_m_tiles, scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr, IEEE: tl.constexpr,
):
    """Grid (query tiles, B * Hq): out and lse of one query tile of one head."""
    m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // num_q_heads).to(tl.int64)
    h = bh % num_q_heads
    hh = h if PER_HEAD else 0
    kvh = (h // group).to(tl.int64)
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    in_m = offs_m < n_tokens
    rows = offs_m.to(tl.int64)
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qt + offs_d[None, :],
                mask=in_m[:, None], other=0.0)
    pos_m = tl.load(Pos + offs_m, mask=in_m, other=0)
    doc_m = tl.load(Doc + offs_m, mask=in_m, other=-1) if HAS_DOCS else offs_m
    lo = tl.load(BandLo + hh * num_m_tiles + m)
    hi = tl.load(BandHi + hh * num_m_tiles + m)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    K_h = K + b * stride_kb + kvh * stride_kh
    V_h = V + b * stride_vb + kvh * stride_vh
    for nt in range(lo, hi):
        offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        in_n = offs_n < n_tokens
        cols = offs_n.to(tl.int64)
        k = tl.load(K_h + cols[:, None] * stride_kt + offs_d[None, :], mask=in_n[:, None], other=0.0)
        v = tl.load(V_h + cols[:, None] * stride_vt + offs_d[None, :], mask=in_n[:, None], other=0.0)
        pos_n = tl.load(Pos + offs_n, mask=in_n, other=0)
        doc_n = tl.load(Doc + offs_n, mask=in_n, other=-2) if HAS_DOCS else offs_n
        bias = _bias_tile(offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
                          Pitch, Shift, Sigma, Window, MODE, CAUSAL, HAS_DOCS)
        s = _dot(q, tl.trans(k), IEEE) * scale_log2 + bias
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all hidden so far: exp2(-inf) = 0, not NaN
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    l_use = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_use[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + rows[:, None] * stride_ot + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=in_m[:, None])
    lse = (m_i + tl.log2(l_use)) * LN2
    tl.store(Lse + (b * num_q_heads + h) * n_tokens + offs_m, lse, mask=in_m)


@triton.jit
def onepass_bwd_dkdv_kernel(
    Q, K, V, DO, Lse, Delta, DK, DV, Pos, Doc, Pitch, Shift, Sigma, Window, BandLo, BandHi,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_dob, stride_dot, stride_doh, stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
    n_tokens, num_q_heads, num_kv_heads, group, num_hh, num_samples, num_n_tiles, scale, scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr, IEEE: tl.constexpr,
):
    """Grid (key tiles, B * Hkv): dK, dV of one key tile, summed over the query heads of its
    group in one program (deterministic: no atomics)."""
    nt = tl.program_id(0)
    bkv = tl.program_id(1)
    b = (bkv // num_kv_heads).to(tl.int64)
    kvh = (bkv % num_kv_heads).to(tl.int64)
    offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_n = offs_n < n_tokens
    cols = offs_n.to(tl.int64)
    k = tl.load(K + b * stride_kb + kvh * stride_kh + cols[:, None] * stride_kt + offs_d[None, :],
                mask=in_n[:, None], other=0.0)
    v = tl.load(V + b * stride_vb + kvh * stride_vh + cols[:, None] * stride_vt + offs_d[None, :],
                mask=in_n[:, None], other=0.0)
    pos_n = tl.load(Pos + offs_n, mask=in_n, other=0)
    doc_n = tl.load(Doc + offs_n, mask=in_n, other=-2) if HAS_DOCS else offs_n
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for g in range(0, group):
        h = kvh * group + g
        hh = h if PER_HEAD else 0
        lo = tl.load(BandLo + hh * num_n_tiles + nt)
        hi = tl.load(BandHi + hh * num_n_tiles + nt)
        Q_h = Q + b * stride_qb + h * stride_qh
        DO_h = DO + b * stride_dob + h * stride_doh
        row_h = (b * num_q_heads + h) * n_tokens
        for mt in range(lo, hi):
            offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
            in_m = offs_m < n_tokens
            rows = offs_m.to(tl.int64)
            q = tl.load(Q_h + rows[:, None] * stride_qt + offs_d[None, :], mask=in_m[:, None], other=0.0)
            do = tl.load(DO_h + rows[:, None] * stride_dot + offs_d[None, :], mask=in_m[:, None], other=0.0)
            lse2 = tl.load(Lse + row_h + offs_m, mask=in_m, other=0.0) * LOG2E
            delta = tl.load(Delta + row_h + offs_m, mask=in_m, other=0.0)
            pos_m = tl.load(Pos + offs_m, mask=in_m, other=0)
            doc_m = tl.load(Doc + offs_m, mask=in_m, other=-1) if HAS_DOCS else offs_m
            bias = _bias_tile(offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
                              Pitch, Shift, Sigma, Window, MODE, CAUSAL, HAS_DOCS)
            s = _dot(q, tl.trans(k), IEEE) * scale_log2 + bias
            p = tl.exp2(s - lse2[:, None])  # (BM, BN); 0 where hidden
            dv += _dot(tl.trans(p.to(do.dtype)), do, IEEE)
            dp = _dot(do, tl.trans(v), IEEE)
            ds = p * (dp - delta[:, None])
            dk += _dot(tl.trans(ds.to(q.dtype)), q, IEEE)
    dk = dk * scale
    tl.store(DK + b * stride_dkb + kvh * stride_dkh + cols[:, None] * stride_dkt + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=in_n[:, None])
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + cols[:, None] * stride_dvt + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=in_n[:, None])


@triton.jit
def onepass_bwd_dq_kernel(
    Q, K, V, DO, Lse, Delta, DQ, Pos, Doc, Pitch, Shift, Sigma, Window, BandLo, BandHi,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_dob, stride_dot, stride_doh, stride_dqb, stride_dqt, stride_dqh,
    n_tokens, num_q_heads, group, num_hh, num_samples, num_m_tiles, scale, scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr, IEEE: tl.constexpr,
):
    """Grid (query tiles, B * Hq): dQ of one query tile over the key tiles of its band."""
    m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // num_q_heads).to(tl.int64)
    h = bh % num_q_heads
    hh = h if PER_HEAD else 0
    kvh = (h // group).to(tl.int64)
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    in_m = offs_m < n_tokens
    rows = offs_m.to(tl.int64)
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qt + offs_d[None, :],
                mask=in_m[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + rows[:, None] * stride_dot + offs_d[None, :],
                 mask=in_m[:, None], other=0.0)
    row_h = (b * num_q_heads + h) * n_tokens
    lse2 = tl.load(Lse + row_h + offs_m, mask=in_m, other=0.0) * LOG2E
    delta = tl.load(Delta + row_h + offs_m, mask=in_m, other=0.0)
    pos_m = tl.load(Pos + offs_m, mask=in_m, other=0)
    doc_m = tl.load(Doc + offs_m, mask=in_m, other=-1) if HAS_DOCS else offs_m
    lo = tl.load(BandLo + hh * num_m_tiles + m)
    hi = tl.load(BandHi + hh * num_m_tiles + m)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    K_h = K + b * stride_kb + kvh * stride_kh
    V_h = V + b * stride_vb + kvh * stride_vh
    for nt in range(lo, hi):
        offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        in_n = offs_n < n_tokens
        cols = offs_n.to(tl.int64)
        k = tl.load(K_h + cols[:, None] * stride_kt + offs_d[None, :], mask=in_n[:, None], other=0.0)
        v = tl.load(V_h + cols[:, None] * stride_vt + offs_d[None, :], mask=in_n[:, None], other=0.0)
        pos_n = tl.load(Pos + offs_n, mask=in_n, other=0)
        doc_n = tl.load(Doc + offs_n, mask=in_n, other=-2) if HAS_DOCS else offs_n
        bias = _bias_tile(offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
                          Pitch, Shift, Sigma, Window, MODE, CAUSAL, HAS_DOCS)
        s = _dot(q, tl.trans(k), IEEE) * scale_log2 + bias
        p = tl.exp2(s - lse2[:, None])
        dp = _dot(do, tl.trans(v), IEEE)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, IEEE)
    dq = dq * scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqt + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=in_m[:, None])


@triton.jit
def count_tile_kernel(Out, Pos, Doc, Pitch, Shift, n_tokens, num_hh, num_samples,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr):
    """Grid (query tiles, key tiles, Hh): the kernels' ``c_ij`` (0 where hidden), int32
    (Hh, n, n), from the same :func:`_count_tile`. Tests only: O(n^2)."""
    m = tl.program_id(0)
    nt = tl.program_id(1)
    hh = tl.program_id(2)
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = offs_m < n_tokens
    in_n = offs_n < n_tokens
    pos_m = tl.load(Pos + offs_m, mask=in_m, other=0)
    pos_n = tl.load(Pos + offs_n, mask=in_n, other=0)
    doc_m = tl.load(Doc + offs_m, mask=in_m, other=-1) if HAS_DOCS else offs_m
    doc_n = tl.load(Doc + offs_n, mask=in_n, other=-2) if HAS_DOCS else offs_n
    count = _count_tile(offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples, Pitch, Shift,
                        CAUSAL, HAS_DOCS)
    ptr = Out + hh.to(tl.int64) * n_tokens * n_tokens + offs_m.to(tl.int64)[:, None] * n_tokens + offs_n[None, :]
    tl.store(ptr, count, mask=in_m[:, None] & in_n[None, :])
