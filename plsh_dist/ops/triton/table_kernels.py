"""Triton kernels that build the fused kernel's inputs on the device: the hash's draws and the band tables.

Imported only where Triton is importable (each table's builder launches them beside its host form:
``CountBias.of``, ``KernelBias.of``, ``NearBlocks.of``, ``TokenLayout.build_on_device``; and
``plsh_dist::layer_seed``).
They replace about sixty small torch ops per call with two launches, and read nothing
back to the host, so a training step's attention can be captured in a CUDA graph.

- :func:`hash_draw_kernel`: the pitch and shift of every (sample, head) of the "iid"
  sampler from a seed held in a device tensor: SplitMix64 in uint64, then
  ``Gamma(2, 1) = -log a - log b`` in float64, exactly the arithmetic of
  :func:`plsh_dist.hashing.counter_uniform` and ``_iid_draws``.
- :func:`band_tables_kernel`: for one kernel's tile shapes, every token's block bounds per
  sample, the row spans of its row tiles, the key spans of its key tiles and the band limits
  of its tiles, equal to :mod:`plsh_dist.ops.triton.tile_bands`' torch reference (the tests hold
  them ``torch.equal``).

Legend: n tokens, s samples, Hh bias heads. Layouts: positions, virtual positions,
document first / end tokens int64[n]; kernel positions int32[n]; pitch, shift float64[s, Hh];
block table int32[1 or 2, Hh, s, n]; row spans int32[Hh, s, row tiles, 4]; key spans
int32[key tiles, 2]; bands int32[Hh, tiles].
"""

from __future__ import annotations

import triton
import triton.language as tl

INT32_MIN = tl.constexpr(-(2**31))
INT32_MAX = tl.constexpr(2**31 - 1)


@triton.jit
def _splitmix64(x):
    """SplitMix64 finaliser on uint64 (wrap-around), as :func:`plsh_dist.splitmix.splitmix64`."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _uniform(key0, t, h, stream: tl.constexpr):
    """``counter_uniform(seed, t, h, stream)`` from ``key0 = splitmix64(seed)``: float64 in (0, 1)."""
    key = _splitmix64(key0 ^ t.to(tl.uint64))
    key = _splitmix64(key ^ h.to(tl.uint64))
    key = _splitmix64(key ^ stream)
    # 53 random bits -> (0, 1); the product by 2^-53 is exact, as the reference's division
    return ((key >> 11).to(tl.float64) + 0.5) * 1.1102230246251565e-16


@triton.jit
def hash_draw_kernel(Seed, Sigma, Pitch, Shift, num_samples, num_heads, FIXED: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Pitch and shift of every (sample t, head h), float64 [s, Hh] each.

    "iid": ``pitch = (-log a - log b) sigma_h``, ``shift = c pitch`` with ``a, b, c`` the
    uniforms of streams 0, 1, 2 of (seed, t, h). ``FIXED`` (the fixed blocks): ``pitch = 2 sigma_h``,
    ``shift = 0``; the seed is not read."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < num_samples * num_heads
    t = idx // num_heads
    h = idx % num_heads
    sigma = tl.load(Sigma + h, mask=inside, other=1.0)
    if FIXED:
        pitch = 2.0 * sigma
        shift = pitch * 0.0
    else:
        key0 = _splitmix64(tl.load(Seed).to(tl.uint64, bitcast=True))
        a = _uniform(key0, t, h, 0)
        b = _uniform(key0, t, h, 1)
        c = _uniform(key0, t, h, 2)
        pitch = (-tl.log(a) - tl.log(b)) * sigma
        shift = c * pitch
    tl.store(Pitch + idx, pitch, mask=inside)
    tl.store(Shift + idx, shift, mask=inside)


@triton.jit
def _bucket(p, pitch, shift):
    """:func:`plsh_dist.hashing.bucket`, the rule it mirrors: ``floor((p - shift) / pitch)`` in
    float64 (a float64 division is correctly rounded on every target, PTX's ``div.rn.f64``)."""
    return tl.math.floor((p - shift) / pitch)


@triton.jit
def _block_start(b, pitch, shift):
    """Smallest integer position whose bucket is >= ``b`` (float64), as
    :func:`plsh_dist.hashing.bucket_start`, the rule it mirrors: the estimate ``ceil(shift + b pitch)``
    is within one of it, and the hash's own rule at the estimate minus one and at the estimate
    corrects it."""
    c = tl.math.ceil(shift + b * pitch)
    below = c - 1.0
    return below + (_bucket(below, pitch, shift) < b).to(tl.float64) + (_bucket(c, pitch, shift) < b).to(tl.float64)


@triton.jit
def _search(Virtual, n, x, RIGHT: tl.constexpr):
    """``torch.searchsorted(virtual, x, right=RIGHT)`` for int64 ``x`` (one or a block): binary search,
    n + 1 outcomes."""
    lo = x * 0
    hi = lo + n
    steps = tl.full((), 1, tl.int64)
    while steps <= n:  # ceil(log2(n + 1)) halvings
        mid = (lo + hi) // 2
        v = tl.load(Virtual + tl.minimum(mid, n - 1))
        if RIGHT:
            go = v <= x
        else:
            go = v < x
        go = go & (mid < hi)
        lo = tl.where(go, mid + 1, lo)
        hi = tl.where(go, hi, mid)
        steps = steps * 2
    return lo


@triton.jit
def _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, Window, token, n, hh, num_samples, num_heads,
               LAST: tl.constexpr, HAS_DOCS: tl.constexpr, WINDOW: tl.constexpr):
    """The token reached by ``token``'s blocks over every sample (``WINDOW``: by its head's window,
    ``|p_i - p_j| < w``): with ``LAST``, one past the token of the latest last position
    (``searchsorted(right)``, cut at the document's end), else the token of the earliest first position
    (cut at the document's first token); int64."""
    if WINDOW:  # within w - 1 virtual positions (the document's own distances)
        behind = tl.load(Window + hh) - 1
        if LAST:
            reach = tl.load(Virtual + token) + behind
        else:
            reach = tl.load(Virtual + token) - behind
    else:
        p = tl.load(Pos + token).to(tl.float64)
        best = p * 0.0
        for t in range(num_samples):
            pitch = tl.load(Pitch + t * num_heads + hh)
            shift = tl.load(Shift + t * num_heads + hh)
            b = _bucket(p, pitch, shift)
            if LAST:
                bound = _block_start(b + 1.0, pitch, shift) - 1.0
                best = tl.where(t == 0, bound, tl.maximum(best, bound))
            else:
                bound = _block_start(b, pitch, shift)
                best = tl.where(t == 0, bound, tl.minimum(best, bound))
        reach = best.to(tl.int64)
        if HAS_DOCS:  # to the document's virtual positions
            reach += tl.load(Virtual + token) - tl.load(Pos + token)
    found = _search(Virtual, n, reach, LAST)
    if HAS_DOCS:
        if LAST:
            found = tl.minimum(found, tl.load(DocEnd + token))
        else:
            found = tl.maximum(found, tl.load(DocFirst + token))
    return found


@triton.jit
def band_tables_kernel(Pos, Virtual, DocFirst, DocEnd, KPos, Pitch, Shift, Window, Table, Rows, KSpan, Lo, Hi,
                       n, num_samples, num_heads, num_row_tiles, num_key_tiles, table_stride,
                       ROW_TILE: tl.constexpr, KEY_TILE: tl.constexpr, CAUSAL: tl.constexpr,
                       QUERY_SIDE: tl.constexpr, HAS_DOCS: tl.constexpr, WRITE_TABLE: tl.constexpr,
                       WINDOW: tl.constexpr):
    """One kernel's tables, program (i, hh): row tile ``i`` of ``ROW_TILE`` tokens, key tile ``i`` of
    ``KEY_TILE`` and band tile ``i`` (a row tile when ``QUERY_SIDE``, else a key tile), bias head ``hh``.

    - block bounds of the row tile's tokens, every sample (``WRITE_TABLE``: stored; starts, then
      lasts when not causal), clamped to int32;
    - row spans ``[min start, max start, min start, max start]`` (causal) or
      ``[min start, max start, min last, max last]`` per sample, over the tile's rows (the last
      token repeated past n, as :func:`plsh_dist.ops.triton.tile_bands.tile_index`);
    - key spans ``[min, max]`` kernel position of the key tile (head 0 only);
    - the band ``[lo, hi)``: key tiles a query tile meets (``QUERY_SIDE``), or query tiles whose
      band meets a key tile, as :func:`~plsh_dist.ops.triton.tile_bands.query_bands` /
      :func:`~plsh_dist.ops.triton.tile_bands.key_bands`.

    ``WINDOW`` (an ALiBi window bias, ``Window`` int64[Hh]): the key spans and the bands only.
    """
    i = tl.program_id(0)
    hh = tl.program_id(1)
    if i < num_row_tiles and not WINDOW:
        offs = i * ROW_TILE + tl.arange(0, ROW_TILE)
        tokens = tl.minimum(offs, n - 1)
        p = tl.load(Pos + tokens).to(tl.float64)
        for t in range(num_samples):
            pitch = tl.load(Pitch + t * num_heads + hh)
            shift = tl.load(Shift + t * num_heads + hh)
            b = _bucket(p, pitch, shift)
            start = tl.minimum(tl.maximum(_block_start(b, pitch, shift), INT32_MIN), INT32_MAX).to(tl.int32)
            row = (hh * num_samples + t).to(tl.int64)
            if WRITE_TABLE:
                tl.store(Table + row * n + offs, start, mask=offs < n)
            lo_s = tl.min(start, axis=0)
            hi_s = tl.max(start, axis=0)
            spans = Rows + (row * num_row_tiles + i) * 4
            tl.store(spans, lo_s)
            tl.store(spans + 1, hi_s)
            if CAUSAL:
                tl.store(spans + 2, lo_s)
                tl.store(spans + 3, hi_s)
            else:
                last = _block_start(b + 1.0, pitch, shift) - 1.0
                last = tl.minimum(tl.maximum(last, INT32_MIN), INT32_MAX).to(tl.int32)
                if WRITE_TABLE:
                    tl.store(Table + table_stride + row * n + offs, last, mask=offs < n)
                tl.store(spans + 2, tl.min(last, axis=0))
                tl.store(spans + 3, tl.max(last, axis=0))
    if i < num_key_tiles:
        if hh == 0:
            kpos = tl.load(KPos + tl.minimum(i * KEY_TILE + tl.arange(0, KEY_TILE), n - 1))
            tl.store(KSpan + 2 * i, tl.min(kpos, axis=0))
            tl.store(KSpan + 2 * i + 1, tl.max(kpos, axis=0))
    if QUERY_SIDE:
        if i < num_row_tiles:
            first = (i * ROW_TILE).to(tl.int64)
            last_token = tl.minimum(first + ROW_TILE - 1, n - 1)
            lo = _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, Window, first, n, hh, num_samples,
                            num_heads, False, HAS_DOCS, WINDOW)
            if CAUSAL:
                end = last_token + KEY_TILE
            else:
                end = _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, Window, last_token, n, hh, num_samples,
                                 num_heads, True, HAS_DOCS, WINDOW) + (KEY_TILE - 1)
            tl.store(Lo + hh * num_row_tiles + i, (lo // KEY_TILE).to(tl.int32))
            tl.store(Hi + hh * num_row_tiles + i, (end // KEY_TILE).to(tl.int32))
    else:
        if i < num_key_tiles:
            first = (i * KEY_TILE).to(tl.int64)
            last_token = tl.minimum(first + KEY_TILE - 1, n - 1)
            end = _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, Window, last_token, n, hh, num_samples,
                             num_heads, True, HAS_DOCS, WINDOW) + (ROW_TILE - 1)
            if CAUSAL:
                lo = first
            else:
                lo = _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, Window, first, n, hh, num_samples,
                                num_heads, False, HAS_DOCS, WINDOW)
            tl.store(Lo + hh * num_key_tiles + i, (lo // ROW_TILE).to(tl.int32))
            tl.store(Hi + hh * num_key_tiles + i, (end // ROW_TILE).to(tl.int32))


@triton.jit
def layer_seed_kernel(Steps, Out, run_key, layer):
    """``hash_seed(run_seed, step, micro_step, layer)`` (:func:`plsh_dist.splitmix.hash_seed`) into the int64
    scalar ``Out``, with (step, micro_step) read from ``Steps`` (int64[2]) on the device and
    ``run_key = splitmix64(run_seed)`` as an int64 (its bits)."""
    key = run_key.to(tl.int64).to(tl.uint64, bitcast=True)
    key = _splitmix64(key ^ tl.load(Steps).to(tl.uint64, bitcast=True))
    key = _splitmix64(key ^ tl.load(Steps + 1).to(tl.uint64, bitcast=True))
    key = _splitmix64(key ^ layer.to(tl.int64).to(tl.uint64, bitcast=True))
    tl.store(Out, (key >> 1).to(tl.int64, bitcast=True))


# -- packed documents (plsh_dist.ops.documents), laid out on the device ------------------------------------


@triton.jit
def document_layout_kernel(PositionIds, Cu, Pos, Virtual, DocFirst, DocEnd, KPos, Doc, Bad, n, seqlen, row_stride,
                           col_stride, num_cu, BLOCK: tl.constexpr):
    """The flat row of a packed (B, T) batch from transformers' ``position_ids`` ((B or 1), T; ``row_stride``
    0 for one row) and its document offsets ``Cu`` (``cu_seq_lens_q``, num_cu = documents + 1), BLOCK
    tokens (and offsets) a program: every
    token's position (int64 ``Pos``, int32 ``KPos``), document (int32 ``Doc``), its document's first
    token and end (int64), and a virtual position ``first * 2^31 + p - p_first``: strictly increasing
    over the row, the real distances within a document (positions below 2^31). ``Bad`` (int32, zero)
    gets 1 where the layout is not one :func:`~plsh_dist.ops.documents.check_cu_seqlens` accepts (offsets
    from 0 to n, strictly increasing, every row start among them) or the positions are not strictly
    increasing within each document in [0, 2^31)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    tok = tl.minimum(i, n - 1).to(tl.int64)
    p = tl.load(PositionIds + (tok // seqlen) * row_stride + (tok % seqlen) * col_stride).to(tl.int64)
    lo = _search(Cu, num_cu, tok, True)  # offsets <= the token: its document is the last of them
    d = tl.maximum(lo - 1, 0)
    first = tl.load(Cu + d).to(tl.int64)
    end = tl.load(Cu + tl.minimum(d + 1, num_cu - 1)).to(tl.int64)
    p_first = tl.load(PositionIds + (first // seqlen) * row_stride + (first % seqlen) * col_stride).to(tl.int64)
    before = tl.maximum(tok - 1, 0)
    prev = tl.load(PositionIds + (before // seqlen) * row_stride + (before % seqlen) * col_stride).to(tl.int64)
    bad = (lo == 0) | (end <= tok) | ((tok % seqlen == 0) & (first != tok)) | (p < 0) | (p > INT32_MAX)
    bad = bad | ((first < tok) & (p <= prev))
    # the offsets themselves: 0 first, n last, strictly increasing
    j = tl.minimum(i, num_cu - 1).to(tl.int64)
    cu_j = tl.load(Cu + j).to(tl.int64)
    cu_next = tl.load(Cu + tl.minimum(j + 1, num_cu - 1)).to(tl.int64)
    bad_cu = ((j == 0) & (cu_j != 0)) | ((j == num_cu - 1) & (cu_j != n)) | ((j < num_cu - 1) & (cu_next <= cu_j))
    bad = (bad & inside) | (bad_cu & (i < num_cu))
    tl.store(Pos + i, p, mask=inside)
    tl.store(KPos + i, p.to(tl.int32), mask=inside)
    tl.store(Virtual + i, first * 2147483648 + (p - p_first), mask=inside)
    tl.store(DocFirst + i, first, mask=inside)
    tl.store(DocEnd + i, end, mask=inside)
    tl.store(Doc + i, d.to(tl.int32), mask=inside)
    tl.atomic_max(Bad, tl.max(bad.to(tl.int32), axis=0))


# -- the near tiles' runs table (plsh_dist.ops.triton.near_runs.NearBlocks), beyond UNROLLED_SAMPLES samples --------


@triton.jit
def _opens(Row, Doc, tok, n, HAS_DOCS: tl.constexpr):
    """Whether a block of the sample whose block starts ``Row`` holds opens on each token of ``tok``: its
    start differs from the previous token's, or its document does (token 0 opens). False past n."""
    inside = tok < n
    before = tl.maximum(tok - 1, 0)
    opens = tl.load(Row + tok, mask=inside, other=0) != tl.load(Row + before, mask=inside, other=0)
    if HAS_DOCS:
        opens = opens | (tl.load(Doc + tok, mask=inside, other=0) != tl.load(Doc + before, mask=inside, other=0))
    return ((tok == 0) | opens) & inside


@triton.jit
def _opening_lanes(opens, LANES: tl.constexpr):
    """The lanes where ``opens`` holds, ascending, at the front of each row (``LANES`` behind them)."""
    lane = tl.arange(0, LANES) + tl.zeros(opens.shape, tl.int32)
    return tl.sort(tl.where(opens, lane, LANES), dim=len(opens.shape) - 1)


@triton.jit
def _running(x, LANES: tl.constexpr, AHEAD: tl.constexpr):
    """Running max of ``x`` (LANES,) over the lanes up to each, or with ``AHEAD`` running min over the lanes
    from each on: log2(LANES) doubling steps of a gather."""
    lane = tl.arange(0, LANES)
    for k in tl.static_range(0, 16):
        if (1 << k) < LANES:
            if AHEAD:
                other = tl.gather(x, tl.minimum(lane + (1 << k), LANES - 1), axis=0)
                x = tl.where(lane + (1 << k) < LANES, tl.minimum(x, other), x)
            else:
                other = tl.gather(x, tl.maximum(lane - (1 << k), 0), axis=0)
                x = tl.where(lane >= (1 << k), tl.maximum(x, other), x)
    return x


@triton.jit
def block_ends_kernel(Starts, Doc, OpenEnd, AnchorFirst, AnchorEnd, n, num_samples, num_anchors,
                      HAS_DOCS: tl.constexpr, ANCHOR: tl.constexpr, CHUNK: tl.constexpr):
    """Program (t, hh): the blocks of sample t, head hh, as runs of tokens ``[first, end)``.

    - ``OpenEnd[hh, t, i]``: one past the block that opens on token i, ``INT32_MAX`` where none opens;
    - ``AnchorFirst / AnchorEnd[hh, t, a]``: the run holding anchor token ``a ANCHOR``.
    Two sweeps over the tokens in chunks, a carry between them: first tokens left to right (a running
    max of the opening tokens), ends right to left (a running min of the next ones)."""
    t = tl.program_id(0)
    hh = tl.program_id(1)
    row = (hh * num_samples + t).to(tl.int64)
    starts = Starts + row * n
    lanes = tl.arange(0, CHUNK)
    first = -1
    for c0 in range(0, n, CHUNK):
        tok = c0 + lanes
        held = tl.maximum(_running(tl.where(_opens(starts, Doc, tok, n, HAS_DOCS), tok, -1), CHUNK, False), first)
        first = tl.max(held, axis=0)
        tl.store(AnchorFirst + row * num_anchors + tok // ANCHOR, held, mask=(tok < n) & (tok % ANCHOR == 0))
    end = n
    num_chunks = (n + CHUNK - 1) // CHUNK
    for back in range(0, num_chunks):
        tok = (num_chunks - 1 - back) * CHUNK + lanes
        nxt = tok + 1
        ahead = tl.where(_opens(starts, Doc, nxt, n, HAS_DOCS), nxt, INT32_MAX)
        ahead = tl.minimum(_running(ahead, CHUNK, True), end)
        end = tl.min(ahead, axis=0)
        inside = tok < n
        opens = _opens(starts, Doc, tok, n, HAS_DOCS)
        tl.store(OpenEnd + row * n + tok, tl.where(opens, ahead, INT32_MAX), mask=inside)
        tl.store(AnchorEnd + row * num_anchors + tok // ANCHOR, ahead, mask=inside & (tok % ANCHOR == 0))


@triton.jit
def _runs(x, big, LANES: tl.constexpr):
    """The distinct values of each row of ``x`` (R, LANES) other than ``big`` (padding): ``(values, weights,
    number)``, values ascending at the front of the row with how often each occurs, ``number`` (R, 1)
    of them (lanes past it hold nothing)."""
    lane = tl.arange(0, LANES) + tl.zeros(x.shape, tl.int32)
    x = tl.sort(x, dim=1)
    valid = x != big
    opens = valid & ((lane == 0) | (x != tl.gather(x, tl.maximum(lane - 1, 0), axis=1)))
    count = tl.sum(valid.to(tl.int32), axis=1)[:, None]
    number = tl.sum(opens.to(tl.int32), axis=1)[:, None]
    at = _opening_lanes(opens, LANES)
    after = tl.where(lane + 1 < number, tl.gather(at, tl.minimum(lane + 1, LANES - 1), axis=1), count)
    return tl.gather(x, tl.minimum(at, LANES - 1), axis=1), after - at, number


@triton.jit
def _heads_before(Totals, hh, num_heads, HEADS: tl.constexpr):
    """The sum of ``Totals[h]`` over the heads ``h < hh``: where head hh's runs begin."""
    heads = tl.arange(0, HEADS)
    return tl.sum(tl.load(Totals + heads, mask=(heads < hh) & (heads < num_heads), other=0), axis=0)


@triton.jit
def near_runs_kernel(OpenEnd, AnchorFirst, AnchorEnd, Offsets, EnterOffsets, Totals, First, End, Weight,
                     n, num_samples, num_heads, num_anchors, entering_at, TOKENS: tl.constexpr,
                     SAMPLES: tl.constexpr, HEADS: tl.constexpr, ANCHOR: tl.constexpr, WRITE: tl.constexpr):
    """Program (token tile, hh): the distinct runs of ``TOKENS`` tokens' blocks and, when the tile starts on
    an anchor, of that anchor's, merged over the samples (a run's weight: how many samples have it).

    Without ``WRITE``: their numbers, into ``Offsets[hh, i]`` (runs opening on token i) and
    ``EnterOffsets[hh, a]`` (runs holding anchor a), which :func:`run_offsets_kernel` turns into running
    sums. With ``WRITE``: each run's first token, end and weight at its slot, runs of a token ordered by
    end, runs of an anchor by (first, end), and the offsets made global: each head's runs after the
    previous heads', the anchors' runs after ``entering_at``."""
    tile = tl.program_id(0)
    hh = tl.program_id(1)
    tok = tile * TOKENS + tl.arange(0, TOKENS)
    sample = tl.arange(0, SAMPLES)
    lane = sample[None, :]
    rows = (hh * num_samples + sample).to(tl.int64)
    ok = (tok[:, None] < n) & (sample[None, :] < num_samples)
    ends, weight, number = _runs(tl.load(OpenEnd + rows[None, :] * n + tok[:, None], mask=ok, other=INT32_MAX),
                                 INT32_MAX, SAMPLES)
    offsets = Offsets + hh * (n + 1)
    if WRITE:
        base = _heads_before(Totals, hh, num_heads, HEADS)
        at = base + tl.load(offsets + tok, mask=tok < n, other=0)
        slot = at[:, None] + lane
        some = lane < number
        tl.store(First + slot, tok[:, None] + lane * 0, mask=some)
        tl.store(End + slot, ends, mask=some)
        tl.store(Weight + slot, weight.to(tl.float16), mask=some)
        tl.store(offsets + tok, at, mask=tok < n)
        tl.store(offsets + n + tok * 0, base + tl.load(Totals + hh) + tok * 0, mask=tok == n - 1)
    else:
        tl.store(offsets + tok, tl.sum(number, axis=1), mask=tok < n)
    if (tile * TOKENS) % ANCHOR == 0:
        anchor = (tile * TOKENS) // ANCHOR
        big = tl.full((), 2**62, tl.int64)
        inside = sample < num_samples
        first = tl.load(AnchorFirst + rows * num_anchors + anchor, mask=inside, other=0).to(tl.int64)
        end = tl.load(AnchorEnd + rows * num_anchors + anchor, mask=inside, other=0)
        key, enter_weight, entered = _runs(tl.where(inside, first * (n + 1) + end, big)[None, :], big, SAMPLES)
        enter_offsets = EnterOffsets + hh * (num_anchors + 1)
        if WRITE:
            enter_base = entering_at + _heads_before(Totals + num_heads, hh, num_heads, HEADS)
            enter_at = enter_base + tl.load(enter_offsets + anchor)
            held = lane < entered
            tl.store(First + enter_at + lane, (key // (n + 1)).to(tl.int32), mask=held)
            tl.store(End + enter_at + lane, (key % (n + 1)).to(tl.int32), mask=held)
            tl.store(Weight + enter_at + lane, enter_weight.to(tl.float16), mask=held)
            tl.store(enter_offsets + anchor, enter_at)
            if anchor == num_anchors - 1:
                tl.store(enter_offsets + num_anchors, enter_base + tl.load(Totals + num_heads + hh))
        else:
            tl.store(enter_offsets + anchor, tl.sum(tl.sum(entered, axis=1), axis=0))


@triton.jit
def run_offsets_kernel(Offsets, EnterOffsets, Totals, n, num_heads, num_anchors, CHUNK: tl.constexpr):
    """Program (list, hh): the counts :func:`near_runs_kernel` wrote, in place, to each head's exclusive
    running sums (list 0: runs by token, ``Offsets[hh, :n]``; 1: runs by anchor, ``EnterOffsets[hh, :a]``)
    and the head's total into ``Totals[list * Hh + hh]``."""
    which = tl.program_id(0)
    hh = tl.program_id(1)
    if which == 0:
        counts = Offsets + hh * (n + 1)
        length = n
    else:
        counts = EnterOffsets + hh * (num_anchors + 1)
        length = num_anchors
    lanes = tl.arange(0, CHUNK)
    total = 0
    for c0 in range(0, length, CHUNK):
        at = c0 + lanes
        x = tl.load(counts + at, mask=at < length, other=0)
        tl.store(counts + at, total + tl.cumsum(x, axis=0) - x, mask=at < length)
        total += tl.sum(x, axis=0)
    tl.store(Totals + which * num_heads + hh, total)
