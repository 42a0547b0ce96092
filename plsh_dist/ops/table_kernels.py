"""Triton kernels that build the fused kernel's inputs on the device: the hash's draws and the band tables.

Imported only where Triton is importable (:mod:`plsh_dist.ops.device_tables` launches them).
They replace about sixty small torch ops per call with two launches, and read nothing
back to the host, so a training step's attention can be captured in a CUDA graph.

- :func:`hash_draw_kernel`: the pitch and shift of every (sample, head) of the "iid"
  sampler from a seed held in a device tensor: SplitMix64 in uint64, then
  ``Gamma(2, 1) = -log a - log b`` in float64, exactly the arithmetic of
  :func:`plsh_dist.hashing.counter_uniform` and ``_iid_draws``.
- :func:`band_tables_kernel`: for one kernel's tile shapes, every token's block bounds per
  sample, the row spans of its row tiles, the key spans of its key tiles and the band limits
  of its tiles, equal to :mod:`plsh_dist.ops.tile_bands`' torch reference (the tests hold
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
    """``floor((p - shift) / pitch)`` in float64 (the hash's own rule; a float64 division is
    correctly rounded on every target, PTX's ``div.rn.f64``)."""
    return tl.math.floor((p - shift) / pitch)


@triton.jit
def _block_start(b, pitch, shift):
    """Smallest integer position whose bucket is >= ``b`` (float64), as
    :func:`plsh_dist.ops.tile_bands.block_start`: the estimate ``ceil(shift + b pitch)`` is within
    one of it, and the hash's own rule at the estimate minus one and at the estimate corrects it."""
    c = tl.math.ceil(shift + b * pitch)
    below = c - 1.0
    return below + (_bucket(below, pitch, shift) < b).to(tl.float64) + (_bucket(c, pitch, shift) < b).to(tl.float64)


@triton.jit
def _search(Virtual, n, x, RIGHT: tl.constexpr):
    """``torch.searchsorted(virtual, x, right=RIGHT)`` for one int64 ``x``: binary search, n + 1 outcomes."""
    lo = x * 0
    hi = lo + n
    steps = lo + 1
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
def _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, token, n, hh, num_samples, num_heads,
               LAST: tl.constexpr, HAS_DOCS: tl.constexpr):
    """The token reached by ``token``'s blocks over every sample: with ``LAST``, one past the token of the
    latest last position (``searchsorted(right)``, cut at the document's end), else the token of the
    earliest first position (cut at the document's first token); int64."""
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
def band_tables_kernel(Pos, Virtual, DocFirst, DocEnd, KPos, Pitch, Shift, Table, Rows, KSpan, Lo, Hi,
                       n, num_samples, num_heads, num_row_tiles, num_key_tiles, table_stride,
                       ROW_TILE: tl.constexpr, KEY_TILE: tl.constexpr, CAUSAL: tl.constexpr,
                       QUERY_SIDE: tl.constexpr, HAS_DOCS: tl.constexpr, WRITE_TABLE: tl.constexpr):
    """One kernel's tables, program (i, hh): row tile ``i`` of ``ROW_TILE`` tokens, key tile ``i`` of
    ``KEY_TILE`` and band tile ``i`` (a row tile when ``QUERY_SIDE``, else a key tile), bias head ``hh``.

    - block bounds of the row tile's tokens, every sample (``WRITE_TABLE``: stored; starts, then
      lasts when not causal), clamped to int32;
    - row spans ``[min start, max start, min start, max start]`` (causal) or
      ``[min start, max start, min last, max last]`` per sample, over the tile's rows (the last
      token repeated past n, as :func:`plsh_dist.ops.tile_bands.tile_index`);
    - key spans ``[min, max]`` kernel position of the key tile (head 0 only);
    - the band ``[lo, hi)``: key tiles a query tile meets (``QUERY_SIDE``), or query tiles whose
      band meets a key tile, as :func:`~plsh_dist.ops.tile_bands.query_bands` /
      :func:`~plsh_dist.ops.tile_bands.key_bands`.
    """
    i = tl.program_id(0)
    hh = tl.program_id(1)
    if i < num_row_tiles:
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
            lo = _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, first, n, hh, num_samples, num_heads,
                            False, HAS_DOCS)
            if CAUSAL:
                end = last_token + KEY_TILE
            else:
                end = _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, last_token, n, hh, num_samples,
                                 num_heads, True, HAS_DOCS) + (KEY_TILE - 1)
            tl.store(Lo + hh * num_row_tiles + i, (lo // KEY_TILE).to(tl.int32))
            tl.store(Hi + hh * num_row_tiles + i, (end // KEY_TILE).to(tl.int32))
    else:
        if i < num_key_tiles:
            first = (i * KEY_TILE).to(tl.int64)
            last_token = tl.minimum(first + KEY_TILE - 1, n - 1)
            end = _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, last_token, n, hh, num_samples,
                             num_heads, True, HAS_DOCS) + (ROW_TILE - 1)
            if CAUSAL:
                lo = first
            else:
                lo = _bounds_at(Pos, Virtual, DocFirst, DocEnd, Pitch, Shift, first, n, hh, num_samples, num_heads,
                                False, HAS_DOCS)
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
