"""Triton kernels of the one-pass estimator: ``softmax(q k^T scale + bias) v`` over banded tiles.

Imported only where Triton is importable (:mod:`plsh_dist.ops.triton_onepass`
launches them). Scores are in base 2 (``exp2`` / ``log2``: no libdevice, so
Triton's CPU interpreter runs the same code).

Bias of one (query tile, key tile), :func:`_bias_tile` (shared by every kernel):

- ``MODE == 0``, count: ``log2 c_ij``, ``c_ij = #{t : bucket_t(p_i) == bucket_t(p_j)}``
  with ``bucket = floor((p - shift) / pitch)`` in float64, the exact arithmetic
  of :func:`plsh_dist.hashing._bucket` (IEEE division, ``div.rn.f64`` on the GPU),
  so the kernel's blocks are the hash's bit for bit (:func:`_count_tile`);
- ``MODE == 1``, ALiBi window: ``-|p_i - p_j| / sigma_h * log2(e)`` where
  ``|p_i - p_j| < window_h``.

Hidden (``-inf``): keys past the sequence, other documents, ``j > i`` when
causal, ``c = 0``. A row with only hidden keys in a tile adds nothing and
produces no NaN (its running max stays ``-inf`` and exponentials use 0).

Layouts: q, dq, out, dout (B, n, Hq, D); k, v, dk, dv (B, n, Hkv, D), any
strides with a unit last one (``HEAD_DIM``: D padded to a power of two, ``D_REAL``: D);
lse and delta (B, Hq, n) fp32; positions
int32[n] (below 2^31); documents int32[n]; pitch, shift float64[s, Hh]; sigma
float32[Hh], window int64[Hh]; bands int32[Hh, tiles].
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["onepass_fwd_kernel", "onepass_bwd_dkdv_kernel", "onepass_bwd_dq_kernel", "count_tile_kernel"]

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


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
def _bucket(p, pitch, shift):
    """:func:`plsh_dist.hashing._bucket` (float64 positions in, float64 integers out)."""
    return tl.floor((p - shift) / pitch)


@triton.jit
def _bucket_start(b, pitch, shift):
    """Smallest integer position whose bucket is >= ``b`` (float64), as
    :func:`plsh_dist.hashing._bucket_start`: the float estimate is off by at most one
    position, and each round steps it towards the hash's own rule."""
    c = tl.ceil(shift + b * pitch)
    for _ in tl.static_range(2):
        c = tl.where(_bucket(c - 1.0, pitch, shift) >= b, c - 1.0, c)
        c = tl.where(_bucket(c, pitch, shift) < b, c + 1.0, c)
    return c


@triton.jit
def _count_tile(anchor, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples, Pitch, Shift,
                CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr):
    """(BM, BN) int32 ``c_ij`` (0 where hidden): the samples whose block of ``p_i`` holds ``p_j``.

    ``anchor``: the tile's scores ``q k^T`` (any (BM, BN) tensor); the count starts from
    it, so the compiler lays the count out as the scores (the MMA layout: a few query rows
    per thread) instead of a blocked layout holding 32 rows per thread, whose float64
    work per row spilled registers (measured with ``launchers/triton_compile_table.py``).

    Per sample, each query row's block ``[start, end)`` comes from the hash's float64
    arithmetic (:func:`_bucket_start`), then the keys are integer compares: bucket(p_j)
    == bucket(p_i) exactly when start <= p_j < end (buckets are monotone in position).
    Causally ``p_j <= p_i < end`` already, so only the start is compared."""
    pq = pos_m.to(tl.float64)
    count = (anchor * 0.0).to(tl.int32)  # zeros in the anchor's layout
    for t in range(0, num_samples):
        pitch = tl.load(Pitch + t * num_hh + hh)
        shift = tl.load(Shift + t * num_hh + hh)
        b = _bucket(pq, pitch, shift)
        start = _bucket_start(b, pitch, shift).to(tl.int32)
        inside = pos_n[None, :] >= start[:, None]
        if not CAUSAL:
            end = _bucket_start(b + 1.0, pitch, shift).to(tl.int32)
            inside = inside & (pos_n[None, :] < end[:, None])
        count += inside.to(tl.int32)
    return tl.where(_visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL, HAS_DOCS), count, 0)


@triton.jit
def _bias_tile(anchor, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
               Pitch, Shift, Sigma, Window,
               MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr):
    """(BM, BN) additive bias in log2 units, ``-inf`` where hidden (module doc)."""
    if MODE == 0:
        count = _count_tile(anchor, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
                            Pitch, Shift, CAUSAL, HAS_DOCS)
        visible = count > 0
        bias = tl.log2(tl.maximum(count, 1).to(tl.float32))
    else:
        dist = tl.abs(pos_m[:, None] - pos_n[None, :])
        window = tl.load(Window + hh).to(tl.int32)
        visible = _visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL, HAS_DOCS) & (dist < window)
        bias = dist.to(tl.float32) * (-LOG2E / tl.load(Sigma + hh))
    return tl.where(visible, bias, float("-inf"))


@triton.jit
def _rows(in_rows, offs_d, HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr):
    """(rows, HEAD_DIM) mask of a q/k/v-shaped tile: real rows, and the real head dims when the
    head dim is padded to a power of two (``D_REAL < HEAD_DIM``; zeros there change no dot)."""
    if D_REAL == HEAD_DIM:  # a constexpr branch: only one is compiled
        mask = in_rows[:, None]
    else:
        mask = in_rows[:, None] & (offs_d[None, :] < D_REAL)
    return mask


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """fp32 accumulation; IEEE fp32 products for fp32 inputs (no TF32 rounding)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _query_tile(Q, Pos, Doc, BandLo, BandHi, m, bh, stride_qb, stride_qt, stride_qh, n_tokens, num_q_heads, group,
                num_m_tiles, HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr, BLOCK_M: tl.constexpr,
                HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr):
    """Query tile ``m`` of (batch, query head) ``bh``, as the forward and the dQ kernel both start:
    b, h, the bias head hh and the KV head kvh; the tile's rows (offs_m, offs_d, in_m, m_rows, row0,
    rel_m); q; its positions and documents; and its band of key tiles [lo, hi)."""
    b = (bh // num_q_heads).to(tl.int64)
    h = bh % num_q_heads
    hh = h if PER_HEAD else 0
    kvh = (h // group).to(tl.int64)
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    in_m = offs_m < n_tokens
    m_rows = _rows(in_m, offs_d, HEAD_DIM, D_REAL)
    row0 = (m * BLOCK_M).to(tl.int64)  # tile offsets: int64 scalar base, int32 within the tile
    rel_m = tl.arange(0, BLOCK_M)
    q = tl.load(Q + b * stride_qb + h * stride_qh + row0 * stride_qt + rel_m[:, None] * stride_qt + offs_d[None, :],
                mask=m_rows, other=0.0)
    pos_m = tl.load(Pos + offs_m, mask=in_m, other=0)
    doc_m = tl.load(Doc + offs_m, mask=in_m, other=-1) if HAS_DOCS else offs_m
    lo = tl.load(BandLo + hh * num_m_tiles + m)
    hi = tl.load(BandHi + hh * num_m_tiles + m)
    return b, h, hh, kvh, offs_m, offs_d, in_m, m_rows, row0, rel_m, q, pos_m, doc_m, lo, hi


@triton.jit
def _key_tile(q, K_h, V_h, nt, rel_n, offs_d, offs_m, pos_m, doc_m, Pos, Doc, n_tokens, hh, num_hh, num_samples,
              Pitch, Shift, Sigma, Window, stride_kt, stride_vt, scale_log2, HEAD_DIM: tl.constexpr,
              D_REAL: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_DOCS: tl.constexpr, IEEE: tl.constexpr):
    """Key tile ``nt`` of a query tile's band: its k and v, and the base-2 logits ``qk scale + bias``
    (the forward and the dQ kernel walk the same tiles)."""
    offs_n = nt * BLOCK_N + rel_n
    in_n = offs_n < n_tokens
    n_rows = _rows(in_n, offs_d, HEAD_DIM, D_REAL)
    col0 = tl.cast(nt, tl.int64) * BLOCK_N
    k = tl.load(K_h + col0 * stride_kt + rel_n[:, None] * stride_kt + offs_d[None, :], mask=n_rows, other=0.0)
    v = tl.load(V_h + col0 * stride_vt + rel_n[:, None] * stride_vt + offs_d[None, :], mask=n_rows, other=0.0)
    pos_n = tl.load(Pos + offs_n, mask=in_n, other=0)
    doc_n = tl.load(Doc + offs_n, mask=in_n, other=-2) if HAS_DOCS else offs_n
    qk = _dot(q, tl.trans(k), IEEE)
    bias = _bias_tile(qk, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
                      Pitch, Shift, Sigma, Window, MODE, CAUSAL, HAS_DOCS)
    return k, v, qk * scale_log2 + bias


@triton.jit
def onepass_fwd_kernel(
    Q, K, V, Out, Lse, Pos, Doc, Pitch, Shift, Sigma, Window, BandLo, BandHi,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ob, stride_ot, stride_oh,
    n_tokens, num_q_heads, group, num_hh, num_samples, num_m_tiles, scale_log2,
    HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr, IEEE: tl.constexpr,
):
    """Grid (query tiles, B * Hq): out and lse of one query tile of one head."""
    m = tl.program_id(0)
    b, h, hh, kvh, offs_m, offs_d, in_m, m_rows, row0, rel_m, q, pos_m, doc_m, lo, hi = _query_tile(
        Q, Pos, Doc, BandLo, BandHi, m, tl.program_id(1), stride_qb, stride_qt, stride_qh, n_tokens, num_q_heads,
        group, num_m_tiles, HEAD_DIM, D_REAL, BLOCK_M, HAS_DOCS, PER_HEAD)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    K_h = K + b * stride_kb + kvh * stride_kh
    V_h = V + b * stride_vb + kvh * stride_vh
    rel_n = tl.arange(0, BLOCK_N)
    for nt in range(lo, hi):
        k, v, s = _key_tile(q, K_h, V_h, nt, rel_n, offs_d, offs_m, pos_m, doc_m, Pos, Doc, n_tokens, hh, num_hh,
                            num_samples, Pitch, Shift, Sigma, Window, stride_kt, stride_vt, scale_log2, HEAD_DIM,
                            D_REAL, BLOCK_N, MODE, CAUSAL, HAS_DOCS, IEEE)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all hidden so far: exp2(-inf) = 0, not NaN
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    l_use = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_use[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + row0 * stride_ot + rel_m[:, None] * stride_ot + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=m_rows)
    lse = (m_i + tl.log2(l_use)) * LN2
    tl.store(Lse + (b * num_q_heads + h) * n_tokens + offs_m, lse, mask=in_m)


@triton.jit
def onepass_bwd_dkdv_kernel(
    Q, K, V, DO, Lse, Delta, DK, DV, Pos, Doc, Pitch, Shift, Sigma, Window, BandLo, BandHi,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_dob, stride_dot, stride_doh, stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
    n_tokens, num_q_heads, num_kv_heads, group, num_hh, num_samples, num_n_tiles, scale, scale_log2,
    HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
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
    n_rows = _rows(in_n, offs_d, HEAD_DIM, D_REAL)
    col0 = tl.cast(nt, tl.int64) * BLOCK_N  # tile offsets: int64 scalar base, int32 within the tile
    rel_n = tl.arange(0, BLOCK_N)
    k = tl.load(K + b * stride_kb + kvh * stride_kh + col0 * stride_kt + rel_n[:, None] * stride_kt + offs_d[None, :],
                mask=n_rows, other=0.0)
    v = tl.load(V + b * stride_vb + kvh * stride_vh + col0 * stride_vt + rel_n[:, None] * stride_vt + offs_d[None, :],
                mask=n_rows, other=0.0)
    pos_n = tl.load(Pos + offs_n, mask=in_n, other=0)
    doc_n = tl.load(Doc + offs_n, mask=in_n, other=-2) if HAS_DOCS else offs_n
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    rel_m = tl.arange(0, BLOCK_M)
    for g in range(0, group):
        h = kvh * group + g
        hh = h if PER_HEAD else 0
        lo = tl.load(BandLo + hh * num_n_tiles + nt)
        hi = tl.load(BandHi + hh * num_n_tiles + nt)
        Q_h = Q + b * stride_qb + h * stride_qh
        DO_h = DO + b * stride_dob + h * stride_doh
        row_h = (b * num_q_heads + h) * n_tokens
        for mt in range(lo, hi):
            offs_m = mt * BLOCK_M + rel_m
            in_m = offs_m < n_tokens
            m_rows = _rows(in_m, offs_d, HEAD_DIM, D_REAL)
            row0 = tl.cast(mt, tl.int64) * BLOCK_M
            q = tl.load(Q_h + row0 * stride_qt + rel_m[:, None] * stride_qt + offs_d[None, :], mask=m_rows,
                        other=0.0)
            do = tl.load(DO_h + row0 * stride_dot + rel_m[:, None] * stride_dot + offs_d[None, :],
                         mask=m_rows, other=0.0)
            lse2 = tl.load(Lse + row_h + offs_m, mask=in_m, other=0.0) * LOG2E
            delta = tl.load(Delta + row_h + offs_m, mask=in_m, other=0.0)
            pos_m = tl.load(Pos + offs_m, mask=in_m, other=0)
            doc_m = tl.load(Doc + offs_m, mask=in_m, other=-1) if HAS_DOCS else offs_m
            qk = _dot(q, tl.trans(k), IEEE)
            bias = _bias_tile(qk, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples,
                              Pitch, Shift, Sigma, Window, MODE, CAUSAL, HAS_DOCS)
            s = qk * scale_log2 + bias
            p = tl.exp2(s - lse2[:, None])  # (BM, BN); 0 where hidden
            dv += _dot(tl.trans(p.to(do.dtype)), do, IEEE)
            dp = _dot(do, tl.trans(v), IEEE)
            ds = p * (dp - delta[:, None])
            dk += _dot(tl.trans(ds.to(q.dtype)), q, IEEE)
    dk = dk * scale
    tl.store(DK + b * stride_dkb + kvh * stride_dkh + col0 * stride_dkt + rel_n[:, None] * stride_dkt
             + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=n_rows)
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + col0 * stride_dvt + rel_n[:, None] * stride_dvt
             + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=n_rows)


@triton.jit
def onepass_bwd_dq_kernel(
    Q, K, V, DO, Lse, Delta, DQ, Pos, Doc, Pitch, Shift, Sigma, Window, BandLo, BandHi,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_dob, stride_dot, stride_doh, stride_dqb, stride_dqt, stride_dqh,
    n_tokens, num_q_heads, group, num_hh, num_samples, num_m_tiles, scale, scale_log2,
    HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr, IEEE: tl.constexpr,
):
    """Grid (query tiles, B * Hq): dQ of one query tile over the key tiles of its band."""
    m = tl.program_id(0)
    b, h, hh, kvh, offs_m, offs_d, in_m, m_rows, row0, rel_m, q, pos_m, doc_m, lo, hi = _query_tile(
        Q, Pos, Doc, BandLo, BandHi, m, tl.program_id(1), stride_qb, stride_qt, stride_qh, n_tokens, num_q_heads,
        group, num_m_tiles, HEAD_DIM, D_REAL, BLOCK_M, HAS_DOCS, PER_HEAD)
    do = tl.load(DO + b * stride_dob + h * stride_doh + row0 * stride_dot + rel_m[:, None] * stride_dot
                 + offs_d[None, :], mask=m_rows, other=0.0)
    row_h = (b * num_q_heads + h) * n_tokens
    lse2 = tl.load(Lse + row_h + offs_m, mask=in_m, other=0.0) * LOG2E
    delta = tl.load(Delta + row_h + offs_m, mask=in_m, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    K_h = K + b * stride_kb + kvh * stride_kh
    V_h = V + b * stride_vb + kvh * stride_vh
    rel_n = tl.arange(0, BLOCK_N)
    for nt in range(lo, hi):
        k, v, s = _key_tile(q, K_h, V_h, nt, rel_n, offs_d, offs_m, pos_m, doc_m, Pos, Doc, n_tokens, hh, num_hh,
                            num_samples, Pitch, Shift, Sigma, Window, stride_kt, stride_vt, scale_log2, HEAD_DIM,
                            D_REAL, BLOCK_N, MODE, CAUSAL, HAS_DOCS, IEEE)
        p = tl.exp2(s - lse2[:, None])
        dp = _dot(do, tl.trans(v), IEEE)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, IEEE)
    dq = dq * scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + row0 * stride_dqt + rel_m[:, None] * stride_dqt + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=m_rows)


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
    anchor = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    count = _count_tile(anchor, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, hh, num_hh, num_samples, Pitch,
                        Shift, CAUSAL, HAS_DOCS)
    ptr = Out + hh.to(tl.int64) * n_tokens * n_tokens + offs_m.to(tl.int64)[:, None] * n_tokens + offs_n[None, :]
    tl.store(ptr, count, mask=in_m[:, None] & in_n[None, :])
