"""Triton kernels of the one-pass estimator: ``softmax(q k^T scale + bias) v`` over banded tiles.

Imported only where Triton is importable (:mod:`plsh_dist.ops.triton.attention`
launches them). Scores are in base 2 (``exp2`` / ``log2``: no libdevice, so
Triton's CPU interpreter runs the same code). :func:`_logits` gives the logits and
weights of one (query tile, key tile) for both biases: ``MODE == 0``, the PLSH count
``p = c_ij exp2(s - m)`` from integer block bounds, and ``MODE == 1``, an ALiBi window.
How the count is walked (the loops, their costs), the transposed dK/dV tiles and the
hidden keys: docs/gpu.md, "The fused one-pass kernel", "Inside the kernels".

Layouts: q, dq, out, dout (B, n, Hq, D); k, v, dk, dv (B, n, Hkv, D), any
strides with a unit last one (``HEAD_DIM``: D padded to a power of two, ``D_REAL``: D);
lse and delta (B, Hq, n) fp32; positions
int32[n] (below 2^31); documents int32[n]; block starts / lasts int32[Hh, s, n]; row spans
int32[Hh, s, row tiles, 4]; key spans int32[key tiles, 2]; sigma float32[Hh], window
int64[Hh]; bands int32[Hh, tiles]; runs (:class:`~plsh_dist.ops.triton.attention.NearBlocks`,
read beyond ``UNROLL_SAMPLES`` samples): offsets int32[Hh, n + 1] and anchors' offsets
int32[Hh, anchors + 1], first and end int32[runs], weight float16[runs].
"""

from __future__ import annotations

import triton
import triton.language as tl

from plsh_dist.ops.triton.kernel_bias import NEAR_ANCHOR, UNROLLED_SAMPLES

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
#: Up to this many samples a near tile counts sample by sample, its per-sample blocks unrolled
#: (pipelined with the key loop); beyond, as a product over the blocks that meet it (:func:`_count_blocks`).
UNROLL_SAMPLES = tl.constexpr(UNROLLED_SAMPLES)
#: Blocks per product of :func:`_count_blocks` (``tl.dot``'s smallest inner dimension).
BLOCK_CHUNK = tl.constexpr(16)
#: Token stride of the anchors whose runs :class:`~plsh_dist.ops.triton.attention.NearBlocks` lists
#: (every tile edge is a multiple of it).
ANCHOR = tl.constexpr(NEAR_ANCHOR)


@triton.jit
def _q_side(x, TRANS: tl.constexpr):
    """A per-query vector broadcast over a tile: rows, or columns of a transposed tile (keys by queries)."""
    if TRANS:
        y = x[None, :]
    else:
        y = x[:, None]
    return y


@triton.jit
def _k_side(x, TRANS: tl.constexpr):
    """A per-key vector broadcast over a tile: columns, or rows of a transposed tile."""
    if TRANS:
        y = x[:, None]
    else:
        y = x[None, :]
    return y


@triton.jit
def _visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr,
             TRANS: tl.constexpr):
    """(BM, BN) (``TRANS``: (BN, BM)) True where key j may be seen by query i at all: in range, causal,
    same document."""
    visible = (_q_side(offs_m, TRANS) < n_tokens) & (_k_side(offs_n, TRANS) < n_tokens)
    if CAUSAL:
        visible = visible & (_k_side(offs_n, TRANS) <= _q_side(offs_m, TRANS))
    if HAS_DOCS:
        visible = visible & (_q_side(doc_m, TRANS) == _k_side(doc_n, TRANS))
    return visible


@triton.jit
def _count_sample(count, full, t, offs_m, in_m, pos_n, n_tokens, row_tile, kmin, kmax, hh, num_row_tiles, Starts,
                  Lasts, Spans, NUM_SAMPLES: tl.constexpr, CAUSAL: tl.constexpr, TRANS: tl.constexpr):
    """Sample ``t``'s share of :func:`_count_tile`: ``full`` + 1 when its blocks hold every key of
    the tile for every row, nothing when none, else ``count`` + its per-score compare."""
    sample = hh * NUM_SAMPLES + t
    span = Spans + (sample * num_row_tiles + row_tile) * 4
    lo_start = tl.load(span)
    hi_start = tl.load(span + 1)
    if CAUSAL:
        every = hi_start <= kmin
        none = lo_start > kmax
    else:
        lo_last = tl.load(span + 2)
        hi_last = tl.load(span + 3)
        every = (hi_start <= kmin) & (lo_last >= kmax)
        none = (lo_start > kmax) | (hi_last < kmin)
    full += every.to(tl.int32)
    if (every.to(tl.int32) + none.to(tl.int32)) == 0:
        row = sample.to(tl.int64) * n_tokens
        start = tl.load(Starts + row + offs_m, mask=in_m, other=0)
        inside = _k_side(pos_n, TRANS) >= _q_side(start, TRANS)
        if not CAUSAL:
            last = tl.load(Lasts + row + offs_m, mask=in_m, other=0)
            inside = inside & (_k_side(pos_n, TRANS) <= _q_side(last, TRANS))
        count += inside.to(tl.float32)
    return count, full


@triton.jit
def _count_tile(anchor, offs_m, offs_n, pos_n, doc_m, doc_n, n_tokens, row_tile, kmin, kmax, hh, num_row_tiles,
                Starts, Lasts, Spans, NUM_SAMPLES: tl.constexpr, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr,
                TRANS: tl.constexpr):
    """(BM, BN) (``TRANS``: (BN, BM)) fp32 ``c_ij`` (0 where hidden): the samples whose block of ``p_i`` holds
    ``p_j``, sample by sample (any tile; the kernels use it where a key tile meets its query tile's rows,
    :func:`_count_before` elsewhere).

    ``anchor``: the tile's q k^T (finite): the count starts as ``anchor * 0`` so that it takes the product's
    register layout, in which a thread holds few rows (a blocked layout gives a thread 16 rows, and 16 loads
    of their block starts a sample). The count is an integer below 2^24: exact in fp32.

    Integer compares only: each token's block ``[start, last]`` per sample comes from the launcher
    (:class:`~plsh_dist.ops.triton.tile_bands.CountTables`, the hash's own float64 arithmetic, once
    per call), so bucket(p_j) == bucket(p_i) is ``start <= p_j <= last`` (buckets are monotone
    in position; causally ``p_j <= p_i <= last`` already). Per sample, two scalars of the query
    tile (its rows' smallest and largest start, ``Spans``) against the key tile's smallest
    and largest position (``kmin``, ``kmax``) decide the whole tile: every row's block holds
    every key (add 1, a scalar), none does (nothing), or only then the per-score compare.
    The loop over the samples is unrolled (``NUM_SAMPLES <= UNROLL_SAMPLES``: beyond, the kernels
    count a near tile with :func:`_count_blocks`)."""
    count = anchor * 0.0
    full = 0
    in_m = offs_m < n_tokens
    for t in tl.static_range(NUM_SAMPLES):
        count, full = _count_sample(count, full, t, offs_m, in_m, pos_n, n_tokens, row_tile, kmin, kmax, hh,
                                    num_row_tiles, Starts, Lasts, Spans, NUM_SAMPLES, CAUSAL, TRANS)
    count += full.to(tl.float32)
    return tl.where(_visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL, HAS_DOCS, TRANS), count, 0.0)


@triton.jit
def _first_blocks(Starts, offs_m, in_m, row_first, hh, n_tokens, NUM_SAMPLES: tl.constexpr,
                  SAMPLES_PAD: tl.constexpr, TRANS: tl.constexpr):
    """A query tile's first blocks, once per query tile: ``a`` int32 (SAMPLES_PAD,), the start of each
    sample's block holding the tile's first row ``row_first``, and ``r`` fp16 (BM, SAMPLES_PAD)
    (``TRANS``: (SAMPLES_PAD, BM)), 1 where row i's block of sample t is that block (0 for the padding
    samples t >= NUM_SAMPLES)."""
    ks = tl.arange(0, SAMPLES_PAD)
    in_k = ks < NUM_SAMPLES
    rows_k = (hh * NUM_SAMPLES + ks).to(tl.int64) * n_tokens
    a = tl.load(Starts + rows_k + row_first, mask=in_k, other=0)
    if TRANS:
        start = tl.load(Starts + rows_k[:, None] + offs_m[None, :], mask=in_k[:, None] & in_m[None, :], other=0)
        r = (start == a[:, None]) & in_k[:, None]
    else:
        start = tl.load(Starts + rows_k[None, :] + offs_m[:, None], mask=in_k[None, :] & in_m[:, None], other=0)
        r = (start == a[None, :]) & in_k[None, :]
    return r.to(tl.float16), a


@triton.jit
def _count_before(r, a, pos_n, TRANS: tl.constexpr):
    """fp32 (BM, BN) (``TRANS``: (BN, BM)) ``c_ij`` of a key tile wholly before its query tile's rows (by
    token), a matrix product on the tensor cores: ``c = r @ [a_t <= p_j]``.

    Why it is exact: a visible key j of such a tile is in row i's document and before the tile's first
    row, so a block of sample t holding both i and j holds the first row too (blocks are contiguous runs
    of a document's positions): it is the first block (``r``), and it holds j iff its start ``a_t <= p_j``
    (causal or not: ``p_j < p_i`` <= its last). Rows of a later document in the tile see no key here.
    0/1 fp16 operands and fp32 accumulation: exact integers."""
    if TRANS:
        c = tl.dot((pos_n[:, None] >= a[None, :]).to(tl.float16), r)
    else:
        c = tl.dot(r, (a[:, None] <= pos_n[None, :]).to(tl.float16))
    return c


@triton.jit
def _count_before_visible(r, a, offs_m, pos_n, doc_m, doc_n, n_tokens, HAS_DOCS: tl.constexpr, TRANS: tl.constexpr):
    """fp32 :func:`_count_before`, 0 where hidden (keys wholly before the rows: in range and causal
    already, so only rows past the sequence and other documents)."""
    visible = _q_side(offs_m < n_tokens, TRANS)
    if HAS_DOCS:
        visible = visible & (_q_side(doc_m, TRANS) == _k_side(doc_n, TRANS))
    return tl.where(visible, _count_before(r, a, pos_n, TRANS), 0.0)


@triton.jit
def _near_tile(BlockOff, EnterOff, row_first, key_first, row_end, key_end, hh, n_tokens):
    """Which runs of the launcher's :class:`~plsh_dist.ops.triton.attention.NearBlocks` :func:`_count_blocks`
    reads for one tile, anchored at its row ``x = max(row_first, key_first)`` (a multiple of ``ANCHOR``):
    those holding ``x`` (``n_enter`` from ``enter_lo``), then those that open on a token after ``x``
    and before both the row end and the key tile's end, as one range ``k < total`` (entry
    ``enter_lo + k`` for ``k < n_enter``, else ``open_shift + k``).

    Why ``x``: a row before ``x`` sees a key of the tile (at or after ``x``, causal or not) only
    through a block that holds ``x``; a row at or after ``x`` is held by ``x``'s block or by one
    that opens in ``(x, row]``."""
    x = tl.maximum(row_first, key_first)
    num_anchors = (n_tokens + ANCHOR - 1) // ANCHOR
    enter = EnterOff + hh.to(tl.int64) * (num_anchors + 1) + x // ANCHOR
    enter_lo = tl.load(enter)
    n_enter = tl.load(enter + 1) - enter_lo
    base = BlockOff + hh.to(tl.int64) * (n_tokens + 1)
    open_lo = tl.load(base + x + 1)
    n_open = tl.load(base + tl.maximum(tl.minimum(row_end, key_end), x + 1)) - open_lo
    return enter_lo, n_enter, open_lo - n_enter, n_enter + n_open


@triton.jit
def _count_blocks(offs_m, offs_n, enter_lo, n_enter, open_shift, total, BlockFirst, BlockEnd, BlockWeight,
                  TRANS: tl.constexpr):
    """fp16 (BM, BN) (``TRANS``: (BN, BM)) ``c_ij`` of any tile (hidden entries not
    cleared), a product of 0/1 matrices on the tensor cores, ``rows x blocks`` by ``blocks x keys``, over
    the blocks that hold a row of the tile and may hold a key of it (:func:`_near_tile`): each a run of
    tokens ``[first, end)`` in one document, with the number of samples that have it as a block
    (``weight``): ``c = [first <= i < end] w @ [first <= j < end]``, ``BLOCK_CHUNK`` runs a product.

    Exact: every block holding both i and j is one run of the range, counted once with its
    samples; integers up to 2048 in fp16 (the launcher refuses more samples). The inner dimension is
    about ``s`` (the runs holding the anchor) plus the runs that open among the tile's first
    ``min(BM, BN)`` rows, ``s BN / sigma`` or fewer: runs repeat across samples at small ``sigma``
    and merge. No per-score work per sample."""
    if TRANS:
        c = tl.zeros([offs_n.shape[0], offs_m.shape[0]], dtype=tl.float16)
    else:
        c = tl.zeros([offs_m.shape[0], offs_n.shape[0]], dtype=tl.float16)
    ks = tl.arange(0, BLOCK_CHUNK)
    for k0 in tl.range(0, total, BLOCK_CHUNK, num_stages=1):
        k = k0 + ks
        ok = k < total
        e = tl.where(k < n_enter, enter_lo + k, open_shift + k)
        first = tl.load(BlockFirst + e, mask=ok, other=0)
        end = tl.load(BlockEnd + e, mask=ok, other=0)  # [0, 0): no token
        w = tl.load(BlockWeight + e, mask=ok, other=0.0)
        if TRANS:
            keys = (offs_n[:, None] >= first[None, :]) & (offs_n[:, None] < end[None, :])
            rows = (offs_m[None, :] >= first[:, None]) & (offs_m[None, :] < end[:, None])
            c = tl.dot(tl.where(keys, w[None, :], 0.0), rows.to(tl.float16), c, out_dtype=tl.float16)
        else:
            rows = (offs_m[:, None] >= first[None, :]) & (offs_m[:, None] < end[None, :])
            keys = (offs_n[None, :] >= first[:, None]) & (offs_n[None, :] < end[:, None])
            c = tl.dot(tl.where(rows, w[None, :], 0.0), keys.to(tl.float16), c, out_dtype=tl.float16)
    return c


@triton.jit
def _near_count(offs_m, offs_n, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight, row_first, key_first, row_end,
                key_end, hh, n_tokens, TRANS: tl.constexpr):
    """:func:`_count_blocks` of one tile over the runs of :func:`_near_tile`."""
    enter_lo, n_enter, open_shift, total = _near_tile(BlockOff, EnterOff, row_first, key_first, row_end, key_end, hh,
                                                      n_tokens)
    return _count_blocks(offs_m, offs_n, enter_lo, n_enter, open_shift, total, BlockFirst, BlockEnd, BlockWeight, TRANS)


@triton.jit
def _logits(qk, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, row_tile, kmin, kmax, hh, num_row_tiles,
            Starts, Lasts, Spans, Sigma, Window, scale_log2, r, a, near, NUM_SAMPLES: tl.constexpr,
            MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr, BEFORE: tl.constexpr,
            TRANS: tl.constexpr = False):
    """(BM, BN) (``TRANS``: (BN, BM), ``qk`` then ``k q^T``) base-2 logits and weights of one tile:
    ``p = w exp2(s - m)`` (module doc).

    Count: ``s = qk scale`` where ``c > 0`` (``-inf`` elsewhere), ``w = c``: the bias
    ``log2 c`` becomes a weight after the exponential (no logarithm); the biased row max
    exceeds the unbiased one by at most ``log2 s``, so ``p <= s`` stays in range. ``BEFORE``:
    the key tile is wholly before the query tile's rows, and ``c`` is the product of the
    tile's first blocks ``r``, ``a`` (:func:`_count_before`); else sample by sample
    (:func:`_count_tile`, ``NUM_SAMPLES <= UNROLL_SAMPLES``) or ``near``, the fp16 product over
    the blocks that meet the tile (:func:`_count_blocks`, computed by the caller: before the tile's
    other operands are live).
    Window: ``s = qk scale - |p_i - p_j| log2(e) / sigma_h`` inside the window, ``w = 1``."""
    if MODE == 0:
        if BEFORE:
            w = _count_before_visible(r, a, offs_m, pos_n, doc_m, doc_n, n_tokens, HAS_DOCS, TRANS)
        elif NUM_SAMPLES <= UNROLL_SAMPLES:
            w = _count_tile(qk, offs_m, offs_n, pos_n, doc_m, doc_n, n_tokens, row_tile, kmin, kmax, hh,
                            num_row_tiles, Starts, Lasts, Spans, NUM_SAMPLES, CAUSAL, HAS_DOCS, TRANS)
        else:
            w = tl.where(_visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL, HAS_DOCS, TRANS),
                         near.to(tl.float32), 0.0)
        s = tl.where(w > 0, qk * scale_log2, float("-inf"))
    else:
        dist = tl.abs(_q_side(pos_m, TRANS) - _k_side(pos_n, TRANS))
        window = tl.load(Window + hh).to(tl.int32)
        visible = _visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL, HAS_DOCS, TRANS) & (dist < window)
        s = tl.where(visible, qk * scale_log2 + dist.to(tl.float32) * (-LOG2E / tl.load(Sigma + hh)), float("-inf"))
        w = 1.0
    return s, w


@triton.jit
def _operand(x, dtype, EMULATE_BF16: tl.constexpr):
    """``x`` (fp32) as a matrix operand of ``dtype``; ``EMULATE_BF16``: rounded to bf16 (nearest, ties
    to even) but kept in fp32, as the compiled bf16 kernel rounds it (tests on Triton's interpreter,
    whose bf16 ``tl.dot`` is wrong; finite values only)."""
    if EMULATE_BF16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


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
def _first_blocks_of(Starts, offs_m, in_m, row_first, hh, n_tokens, BLOCK_M: tl.constexpr,
                     NUM_SAMPLES: tl.constexpr, SAMPLES_PAD: tl.constexpr, MODE: tl.constexpr, TRANS: tl.constexpr):
    """:func:`_first_blocks` for the count; zeros for the window (which has no block tables)."""
    if MODE == 0:
        r, a = _first_blocks(Starts, offs_m, in_m, row_first, hh, n_tokens, NUM_SAMPLES, SAMPLES_PAD, TRANS)
    else:
        a = tl.zeros([SAMPLES_PAD], dtype=tl.int32)
        if TRANS:
            r = tl.zeros([SAMPLES_PAD, BLOCK_M], dtype=tl.float16)
        else:
            r = tl.zeros([BLOCK_M, SAMPLES_PAD], dtype=tl.float16)
    return r, a


@triton.jit
def _key_tile(q, K_h, V_h, nt, rel_n, offs_d, m, offs_m, pos_m, doc_m, Pos, Doc, KSpan, n_tokens, hh, num_m_tiles,
              Starts, Lasts, Spans, Sigma, Window, stride_kt, stride_vt, scale_log2, r, a, BlockOff, EnterOff,
              BlockFirst, BlockEnd, BlockWeight, HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, NUM_SAMPLES: tl.constexpr, SAMPLES_PAD: tl.constexpr, MODE: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr, IEEE: tl.constexpr, BEFORE: tl.constexpr):
    """Key tile ``nt`` of query tile ``m``'s band: its k and v, the base-2 logits and the weights
    (:func:`_logits`; the forward and the dQ kernel walk the same tiles)."""
    offs_n = nt * BLOCK_N + rel_n
    in_n = offs_n < n_tokens
    n_rows = _rows(in_n, offs_d, HEAD_DIM, D_REAL)
    col0 = tl.cast(nt, tl.int64) * BLOCK_N
    k = tl.load(K_h + col0 * stride_kt + rel_n[:, None] * stride_kt + offs_d[None, :], mask=n_rows, other=0.0)
    v = tl.load(V_h + col0 * stride_vt + rel_n[:, None] * stride_vt + offs_d[None, :], mask=n_rows, other=0.0)
    pos_n = tl.load(Pos + offs_n, mask=in_n, other=0)
    doc_n = tl.load(Doc + offs_n, mask=in_n, other=-2) if HAS_DOCS else offs_n
    kmin = tl.load(KSpan + 2 * nt)
    kmax = tl.load(KSpan + 2 * nt + 1)
    near = 0.0
    if MODE == 0 and NUM_SAMPLES > UNROLL_SAMPLES and not BEFORE:
        near = _near_count(offs_m, offs_n, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight, m * BLOCK_M,
                           nt * BLOCK_N, tl.minimum(m * BLOCK_M + BLOCK_M, n_tokens),
                           tl.minimum((nt + 1) * BLOCK_N, n_tokens), hh, n_tokens, False)
    qk = _dot(q, tl.trans(k), IEEE)
    s, w = _logits(qk, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, m, kmin, kmax, hh, num_m_tiles,
                   Starts, Lasts, Spans, Sigma, Window, scale_log2, r, a, near, NUM_SAMPLES, MODE, CAUSAL, HAS_DOCS,
                   BEFORE)
    return k, v, s, w


@triton.jit
def _before_end(lo, hi, row_first, BLOCK_N: tl.constexpr):
    """End of the band's key tiles [lo, end) wholly before the row ``row_first`` (the count's product form)."""
    return tl.minimum(tl.maximum(row_first // BLOCK_N, lo), hi)


@triton.jit
def _lse2(Lse, rows, in_m):
    """Saved lse in base 2 for the backward; a row that saw no key (lse = -inf, out = 0) reads
    +inf, so that its ``p = exp2(-inf - inf) = 0`` and its gradients are zero, not NaN."""
    lse2 = tl.load(Lse + rows, mask=in_m, other=0.0) * LOG2E
    return tl.where(lse2 == float("-inf"), float("inf"), lse2)


@triton.jit
def _softmax_step(m_i, l_i, acc, s, w, v, IEEE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """One key tile of the forward's online softmax: running max, sum and output accumulator."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all hidden so far: exp2(-inf) = 0, not NaN
    p = tl.exp2(s - m_use[:, None]) * w
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(_operand(p, v.dtype, EMULATE_BF16), v, IEEE)
    return m_new, l_i, acc


@triton.jit
def onepass_fwd_kernel(
    Q, K, V, Out, Lse, Pos, Doc, KSpan, Starts, Lasts, Spans, Sigma, Window, BandLo, BandHi, BlockOff, EnterOff,
    BlockFirst, BlockEnd, BlockWeight, stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb,
    stride_vt, stride_vh, stride_ob, stride_ot, stride_oh,
    n_tokens, num_q_heads, group, num_m_tiles, scale_log2,
    HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SAMPLES: tl.constexpr, SAMPLES_PAD: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr, IEEE: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    """Grid (query tiles, B * Hq): out and lse of one query tile of one head. The count walks its band
    in two loops: the key tiles wholly before the tile's rows (the count a product,
    :func:`_count_before`), then the rest (sample by sample, or beyond ``UNROLL_SAMPLES`` samples a
    product over the runs of blocks, :func:`_count_blocks`)."""
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
    r, a = _first_blocks_of(Starts, offs_m, in_m, m * BLOCK_M, hh, n_tokens, BLOCK_M, NUM_SAMPLES, SAMPLES_PAD,
                            MODE, False)
    if MODE == 0:
        before = _before_end(lo, hi, m * BLOCK_M, BLOCK_N)
        for nt in range(lo, before):
            k, v, s, w = _key_tile(q, K_h, V_h, nt, rel_n, offs_d, m, offs_m, pos_m, doc_m, Pos, Doc, KSpan,
                                   n_tokens, hh, num_m_tiles, Starts, Lasts, Spans, Sigma, Window, stride_kt,
                                   stride_vt, scale_log2, r, a, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight,
                                   HEAD_DIM, D_REAL, BLOCK_M, BLOCK_N, NUM_SAMPLES, SAMPLES_PAD, MODE, CAUSAL,
                                   HAS_DOCS, IEEE, True)
            m_i, l_i, acc = _softmax_step(m_i, l_i, acc, s, w, v, IEEE, EMULATE_BF16)
        lo = before
    for nt in range(lo, hi):
        k, v, s, w = _key_tile(q, K_h, V_h, nt, rel_n, offs_d, m, offs_m, pos_m, doc_m, Pos, Doc, KSpan, n_tokens,
                               hh, num_m_tiles, Starts, Lasts, Spans, Sigma, Window, stride_kt, stride_vt,
                               scale_log2, r, a, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight, HEAD_DIM,
                               D_REAL, BLOCK_M, BLOCK_N, NUM_SAMPLES, SAMPLES_PAD, MODE, CAUSAL, HAS_DOCS, IEEE, False)
        m_i, l_i, acc = _softmax_step(m_i, l_i, acc, s, w, v, IEEE, EMULATE_BF16)
    l_use = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_use[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + row0 * stride_ot + rel_m[:, None] * stride_ot + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=m_rows)
    lse = (m_i + tl.log2(l_use)) * LN2
    tl.store(Lse + (b * num_q_heads + h) * n_tokens + offs_m, lse, mask=in_m)


@triton.jit
def _dkdv_tile(dk, dv, k, v, mt, pos_n, doc_n, offs_n, kmin, kmax, Q_h, DO_h, Lse, Delta, Pos, Doc, Starts, Lasts,
               Spans, Sigma, Window, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight, key_first, key_end, row_h,
               rel_m, offs_d, stride_qt, stride_dot, n_tokens, hh, num_m_tiles, scale_log2, HEAD_DIM: tl.constexpr,
               D_REAL: tl.constexpr, BLOCK_M: tl.constexpr, NUM_SAMPLES: tl.constexpr, SAMPLES_PAD: tl.constexpr,
               MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr, IEEE: tl.constexpr,
               EMULATE_BF16: tl.constexpr, BEFORE: tl.constexpr):
    """dK, dV of one key tile plus query tile ``mt``'s share, on the transposed tile (keys by queries,
    as Triton's fused-attention backward: every product has the key tile's BLOCK_N rows, which
    wgmma needs, >= 64 per warpgroup)."""
    offs_m = mt * BLOCK_M + rel_m
    near = 0.0
    if MODE == 0 and NUM_SAMPLES > UNROLL_SAMPLES and not BEFORE:
        near = _near_count(offs_m, offs_n, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight, mt * BLOCK_M,
                           key_first, tl.minimum(mt * BLOCK_M + BLOCK_M, n_tokens), key_end, hh, n_tokens, True)
    in_m = offs_m < n_tokens
    m_rows = _rows(in_m, offs_d, HEAD_DIM, D_REAL)
    row0 = tl.cast(mt, tl.int64) * BLOCK_M
    q = tl.load(Q_h + row0 * stride_qt + rel_m[:, None] * stride_qt + offs_d[None, :], mask=m_rows, other=0.0)
    do = tl.load(DO_h + row0 * stride_dot + rel_m[:, None] * stride_dot + offs_d[None, :], mask=m_rows, other=0.0)
    lse2 = _lse2(Lse, row_h + offs_m, in_m)
    delta = tl.load(Delta + row_h + offs_m, mask=in_m, other=0.0)
    pos_m = tl.load(Pos + offs_m, mask=in_m, other=0)
    doc_m = tl.load(Doc + offs_m, mask=in_m, other=-1) if HAS_DOCS else offs_m
    if BEFORE:
        r, a = _first_blocks(Starts, offs_m, in_m, mt * BLOCK_M, hh, n_tokens, NUM_SAMPLES, SAMPLES_PAD, True)
    else:
        r = tl.zeros([SAMPLES_PAD, BLOCK_M], dtype=tl.float16)
        a = tl.zeros([SAMPLES_PAD], dtype=tl.int32)
    kq = _dot(k, tl.trans(q), IEEE)
    s, w = _logits(kq, offs_m, offs_n, pos_m, pos_n, doc_m, doc_n, n_tokens, mt, kmin, kmax, hh, num_m_tiles,
                   Starts, Lasts, Spans, Sigma, Window, scale_log2, r, a, near, NUM_SAMPLES, MODE, CAUSAL, HAS_DOCS,
                   BEFORE, True)
    p = tl.exp2(s - lse2[None, :]) * w  # (BN, BM); 0 where hidden
    dv += _dot(_operand(p, do.dtype, EMULATE_BF16), do, IEEE)
    dp = _dot(v, tl.trans(do), IEEE)
    ds = p * (dp - delta[None, :])
    dk += _dot(_operand(ds, q.dtype, EMULATE_BF16), q, IEEE)
    return dk, dv


@triton.jit
def onepass_bwd_dkdv_kernel(
    Q, K, V, DO, Lse, Delta, DK, DV, Pos, Doc, KSpan, Starts, Lasts, Spans, Sigma, Window, BandLo, BandHi, BlockOff,
    EnterOff, BlockFirst, BlockEnd, BlockWeight, stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh, stride_dob, stride_dot, stride_doh, stride_dkb, stride_dkt, stride_dkh,
    stride_dvb, stride_dvt, stride_dvh, n_tokens, num_q_heads, num_kv_heads, group, num_n_tiles, num_m_tiles, scale,
    scale_log2, HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SAMPLES: tl.constexpr, SAMPLES_PAD: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr, IEEE: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    """Grid (key tiles, B * Hkv): dK, dV of one key tile, summed over the query heads of its
    group in one program (deterministic: no atomics). The count walks each band in two loops:
    the query tiles the key tile meets or follows (sample by sample, or beyond ``UNROLL_SAMPLES``
    samples a product over the runs of blocks, :func:`_count_blocks`), then those wholly after it
    (the count a product, :func:`_count_before`)."""
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
    kmin = tl.load(KSpan + 2 * nt)
    kmax = tl.load(KSpan + 2 * nt + 1)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    rel_m = tl.arange(0, BLOCK_M)
    after = ((nt + 1) * BLOCK_N + BLOCK_M - 1) // BLOCK_M  # first query tile wholly after the key tile
    key_first = nt * BLOCK_N
    key_end = tl.minimum(key_first + BLOCK_N, n_tokens)
    for g in range(0, group):
        h = kvh * group + g
        hh = h if PER_HEAD else 0
        lo = tl.load(BandLo + hh * num_n_tiles + nt)
        hi = tl.load(BandHi + hh * num_n_tiles + nt)
        Q_h = Q + b * stride_qb + h * stride_qh
        DO_h = DO + b * stride_dob + h * stride_doh
        row_h = (b * num_q_heads + h) * n_tokens
        split = hi
        if MODE == 0:
            split = tl.minimum(tl.maximum(after, lo), hi)
        for mt in range(lo, split):
            dk, dv = _dkdv_tile(dk, dv, k, v, mt, pos_n, doc_n, offs_n, kmin, kmax, Q_h, DO_h, Lse, Delta, Pos, Doc,
                                Starts, Lasts, Spans, Sigma, Window, BlockOff, EnterOff, BlockFirst, BlockEnd,
                                BlockWeight, key_first, key_end, row_h, rel_m, offs_d, stride_qt, stride_dot,
                                n_tokens, hh, num_m_tiles, scale_log2, HEAD_DIM, D_REAL, BLOCK_M, NUM_SAMPLES,
                                SAMPLES_PAD, MODE, CAUSAL, HAS_DOCS, IEEE, EMULATE_BF16, False)
        if MODE == 0:
            for mt in range(split, hi):
                dk, dv = _dkdv_tile(dk, dv, k, v, mt, pos_n, doc_n, offs_n, kmin, kmax, Q_h, DO_h, Lse, Delta, Pos,
                                    Doc, Starts, Lasts, Spans, Sigma, Window, BlockOff, EnterOff, BlockFirst,
                                    BlockEnd, BlockWeight, key_first, key_end, row_h, rel_m, offs_d, stride_qt,
                                    stride_dot, n_tokens, hh, num_m_tiles, scale_log2, HEAD_DIM, D_REAL, BLOCK_M,
                                    NUM_SAMPLES, SAMPLES_PAD, MODE, CAUSAL, HAS_DOCS, IEEE, EMULATE_BF16, True)
    dk = dk * scale
    tl.store(DK + b * stride_dkb + kvh * stride_dkh + col0 * stride_dkt + rel_n[:, None] * stride_dkt
             + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=n_rows)
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + col0 * stride_dvt + rel_n[:, None] * stride_dvt
             + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=n_rows)


@triton.jit
def _dq_step(dq, s, w, k, v, do, lse2, delta, IEEE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """One key tile's share of dQ."""
    p = tl.exp2(s - lse2[:, None]) * w
    dp = _dot(do, tl.trans(v), IEEE)
    ds = p * (dp - delta[:, None])
    return dq + _dot(_operand(ds, k.dtype, EMULATE_BF16), k, IEEE)


@triton.jit
def onepass_bwd_dq_kernel(
    Q, K, V, DO, Lse, Delta, DQ, Pos, Doc, KSpan, Starts, Lasts, Spans, Sigma, Window, BandLo, BandHi, BlockOff,
    EnterOff, BlockFirst, BlockEnd, BlockWeight, stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh, stride_dob, stride_dot, stride_doh, stride_dqb, stride_dqt, stride_dqh,
    n_tokens, num_q_heads, group, num_m_tiles, scale, scale_log2,
    HEAD_DIM: tl.constexpr, D_REAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SAMPLES: tl.constexpr, SAMPLES_PAD: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_DOCS: tl.constexpr, PER_HEAD: tl.constexpr, IEEE: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    """Grid (query tiles, B * Hq): dQ of one query tile over the key tiles of its band (the
    forward's two loops)."""
    m = tl.program_id(0)
    b, h, hh, kvh, offs_m, offs_d, in_m, m_rows, row0, rel_m, q, pos_m, doc_m, lo, hi = _query_tile(
        Q, Pos, Doc, BandLo, BandHi, m, tl.program_id(1), stride_qb, stride_qt, stride_qh, n_tokens, num_q_heads,
        group, num_m_tiles, HEAD_DIM, D_REAL, BLOCK_M, HAS_DOCS, PER_HEAD)
    do = tl.load(DO + b * stride_dob + h * stride_doh + row0 * stride_dot + rel_m[:, None] * stride_dot
                 + offs_d[None, :], mask=m_rows, other=0.0)
    row_h = (b * num_q_heads + h) * n_tokens
    lse2 = _lse2(Lse, row_h + offs_m, in_m)
    delta = tl.load(Delta + row_h + offs_m, mask=in_m, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    K_h = K + b * stride_kb + kvh * stride_kh
    V_h = V + b * stride_vb + kvh * stride_vh
    rel_n = tl.arange(0, BLOCK_N)
    r, a = _first_blocks_of(Starts, offs_m, in_m, m * BLOCK_M, hh, n_tokens, BLOCK_M, NUM_SAMPLES, SAMPLES_PAD,
                            MODE, False)
    if MODE == 0:
        before = _before_end(lo, hi, m * BLOCK_M, BLOCK_N)
        for nt in range(lo, before):
            k, v, s, w = _key_tile(q, K_h, V_h, nt, rel_n, offs_d, m, offs_m, pos_m, doc_m, Pos, Doc, KSpan,
                                   n_tokens, hh, num_m_tiles, Starts, Lasts, Spans, Sigma, Window, stride_kt,
                                   stride_vt, scale_log2, r, a, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight,
                                   HEAD_DIM, D_REAL, BLOCK_M, BLOCK_N, NUM_SAMPLES, SAMPLES_PAD, MODE, CAUSAL,
                                   HAS_DOCS, IEEE, True)
            dq = _dq_step(dq, s, w, k, v, do, lse2, delta, IEEE, EMULATE_BF16)
        lo = before
    for nt in range(lo, hi):
        k, v, s, w = _key_tile(q, K_h, V_h, nt, rel_n, offs_d, m, offs_m, pos_m, doc_m, Pos, Doc, KSpan, n_tokens,
                               hh, num_m_tiles, Starts, Lasts, Spans, Sigma, Window, stride_kt, stride_vt,
                               scale_log2, r, a, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight, HEAD_DIM,
                               D_REAL, BLOCK_M, BLOCK_N, NUM_SAMPLES, SAMPLES_PAD, MODE, CAUSAL, HAS_DOCS, IEEE, False)
        dq = _dq_step(dq, s, w, k, v, do, lse2, delta, IEEE, EMULATE_BF16)
    dq = dq * scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + row0 * stride_dqt + rel_m[:, None] * stride_dqt + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=m_rows)
