"""The fused kernel's view of a bias for one call: its tables and band limits, every head at once,
and the one place they are built.

:class:`KernelBias` holds, for the forward, dK/dV and dQ kernels at their own tile
shapes, the arguments each kernel reads (block bounds and per-tile spans of a
:class:`~plsh_dist.ops.triton.tile_bands.CountBias`, or a
:class:`~plsh_dist.ops.triton.tile_bands.WindowBias`'s sigma and windows) and the band
limits of each tile. :meth:`KernelBias.of` builds it, in one of two forms that give equal
tables (``torch.equal``, dtypes included, so the kernels keep one build):

- ``by="torch"``: torch ops on the layout's device (:mod:`~plsh_dist.ops.triton.tile_bands`'
  reach of each token): the reference, and what runs where Triton cannot (CPU tensors without
  the interpreter);
- ``by="kernels"``: one int32 buffer filled by three launches of
  :func:`~plsh_dist.ops.triton.table_kernels.band_tables_kernel` (CUDA tensors, or CPU ones
  under Triton's interpreter): a few eager ops whatever the heads, samples and tokens.

The launchers (:mod:`plsh_dist.ops.triton.attention`) read it; the wing's cache
(:mod:`plsh_dist.ops.triton.cache`) keeps one between calls with the same hash.

Legend: n tokens, s samples, Hh bias heads (1 shared, Hq per head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.ops.triton.runtime import table_kernels as launch
from plsh_dist.ops.triton.tile_bands import (CountBias, CountReach, TileConfig, WindowBias, WindowReach, key_bands,
                                             num_tiles, query_bands)
from plsh_dist.ops.triton.token_layout import TokenLayout


#: Samples up to which the kernels count a near tile sample by sample (their per-sample blocks
#: unrolled); beyond, as a product over the blocks that meet the tile
#: (:class:`~plsh_dist.ops.triton.near_runs.NearBlocks`). Here, not beside the kernels or their
#: launcher: both read them, and the kernels' module imports Triton.
UNROLLED_SAMPLES = 16
#: Largest s the near product takes (fp16 weights and counts hold integers up to 2048 exactly).
MAX_NEAR_SAMPLES = 2048
#: Token stride of the anchors of the near tiles' runs table (every kernel tile's edge is a multiple).
NEAR_ANCHOR = 16


def padded_samples(s: int) -> int:
    """``s`` padded to a power of two >= 16 (``tl.dot``'s smallest inner dimension)."""
    return max(16, 1 << (s - 1).bit_length())


@dataclass(frozen=True)
class KernelTables:
    """One kernel's view of the bias at its tile shape.

    Attributes:
        args: kernel arguments (KSpan, Starts, Lasts, Spans, Sigma, Window); unused ones a dummy tensor.
        consts: constexprs (MODE, NUM_SAMPLES, SAMPLES_PAD: the samples padded to a power of two >= 16,
            the inner dimension of the count's product form).
        lo, hi: int32 (Hh, tiles) band limits (:func:`~plsh_dist.ops.triton.tile_bands.query_bands` /
            :func:`~plsh_dist.ops.triton.tile_bands.key_bands`).
    """

    args: tuple
    consts: dict
    lo: torch.Tensor
    hi: torch.Tensor


@dataclass(frozen=True, eq=False)
class KernelBias:
    """A bias as the kernels read it, for one call: the tables and bands of the forward, dK/dV
    and dQ kernels, every head at once. Built once per (bias, tokens, causal, tiles): the
    forward and backward of a call share it, and so do calls with the same hash
    (:mod:`plsh_dist.ops.triton.cache`).

    Attributes:
        bias: the :class:`CountBias` or :class:`WindowBias`; layout: the tokens; causal.
        fwd, dkdv, dq: :class:`KernelTables` at the tiles of each kernel.
    """

    bias: CountBias | WindowBias
    layout: TokenLayout
    causal: bool
    fwd: KernelTables
    dkdv: KernelTables
    dq: KernelTables

    @classmethod
    def of(cls, bias: CountBias | WindowBias, layout: TokenLayout, causal: bool,
           tiles: tuple[TileConfig, TileConfig, TileConfig], *, by: str = "torch") -> "KernelBias":
        """The tables of ``bias`` over ``layout`` for the (forward, dK/dV, dQ) ``tiles``, built ``by``
        torch ops (:func:`_by_torch`) or the table kernels (:func:`_by_kernels`): equal tables."""
        forms = {"torch": _by_torch, "kernels": _by_kernels}
        if by not in forms:
            raise ValueError(f"a kernel bias is built by 'torch' or 'kernels', got {by!r}")
        return cls(bias, layout, causal, *forms[by](bias, layout, causal, tiles))


def _by_torch(bias, layout: TokenLayout, causal: bool, tiles) -> list[KernelTables]:
    """The (forward, dK/dV, dQ) tables by torch ops on the layout's device, each token's reach
    built once at the largest tile and read at each kernel's tile sides."""
    fwd, kv, qt = tiles
    largest = max(max(c.block_m, c.block_n) for c in tiles)
    device = layout.positions.device
    if isinstance(bias, CountBias):
        reach = CountReach.build(bias, layout, causal, largest, end_sizes=(kv.block_n,))
        starts, lasts = reach.table()
        lasts = starts if lasts is None else lasts
        dummy = torch.zeros(1, dtype=torch.float32, device=device)
        consts = dict(MODE=0, NUM_SAMPLES=bias.num_samples, SAMPLES_PAD=padded_samples(bias.num_samples))
        fixed, rows = (dummy, dummy.long()), reach.row_spans
    else:
        reach = WindowReach(bias, layout, largest)
        dummy = torch.zeros(1, dtype=torch.int32, device=device)
        fixed, consts, rows = (bias.sigma, bias.window), dict(MODE=1, NUM_SAMPLES=1, SAMPLES_PAD=16), None
    memo: dict = {}

    def once(key, make):  # tables shared by kernels with the same tile side
        if key not in memo:
            memo[key] = make()
        return memo[key]

    def tables(cfg: TileConfig, bands) -> KernelTables:
        kspan = once(("kspan", cfg.block_n), lambda: reach.key_spans(cfg.block_n))
        if rows is None:
            args = (kspan, dummy, dummy, dummy, *fixed)
        else:
            args = (kspan, starts, lasts, once(("rows", cfg.block_m), lambda: rows(cfg.block_m)), *fixed)
        lo, hi = once((bands, cfg.block_m, cfg.block_n), lambda: bands(reach, cfg.block_m, cfg.block_n, causal))
        return KernelTables(args, consts, lo, hi)

    return [tables(fwd, query_bands), tables(kv, key_bands), tables(qt, query_bands)]


def _by_kernels(bias, layout: TokenLayout, causal: bool, tiles) -> list[KernelTables]:
    """The (forward, dK/dV, dQ) tables by the table kernels on the layout's device: one int32 buffer,
    three launches (for a count bias the first also writes every token's block bounds), no host read.
    The tables no kernel reads are views with :func:`_by_torch`'s dtypes, so the kernels keep one build."""
    window = isinstance(bias, WindowBias)
    n, H = layout.n, bias.num_heads
    s = 0 if window else bias.num_samples
    device = layout.positions.device
    sides = ((tiles[0], True), (tiles[1], False), (tiles[2], True))
    table_rows = 1 if causal else 2
    sizes = [table_rows * H * s * n]
    for cfg, query_side in sides:
        rows, keys = num_tiles(n, cfg.block_m), num_tiles(n, cfg.block_n)
        sizes += [H * s * rows * 4, keys * 2, 2 * H * (rows if query_side else keys)]
    buffer = torch.empty(sum(sizes) + 2, dtype=torch.int32, device=device)
    parts = iter(buffer[2:].split(sizes))
    table = next(parts).view(table_rows, H, s, n)
    starts, lasts = table[0], table[-1]
    has_docs = layout.doc is not None
    dummy = layout.positions  # an int64 pointer, never read
    if window:  # the kernels read no block bounds or spans
        consts, fixed, pitch, shift = dict(MODE=1, NUM_SAMPLES=1, SAMPLES_PAD=16), (bias.sigma, bias.window), \
            bias.sigma, bias.sigma
    else:  # MODE 0 reads no sigma or window
        consts = dict(MODE=0, NUM_SAMPLES=s, SAMPLES_PAD=padded_samples(s))
        fixed, pitch, shift = (buffer[:2].view(torch.float32), buffer[:2].view(torch.int64)), bias.pitch, bias.shift
    mod = launch(device)
    built = []
    for index, (cfg, query_side) in enumerate(sides):
        rows, keys = num_tiles(n, cfg.block_m), num_tiles(n, cfg.block_n)
        spans = next(parts).view(H, s, rows, 4)
        kspan = next(parts).view(keys, 2)
        lo, hi = next(parts).view(2, H, rows if query_side else keys)
        mod.band_tables_kernel[(max(rows, keys), H)](
            layout.positions, layout.virtual, layout.doc_first if has_docs else dummy,
            layout.doc_end if has_docs else dummy, layout.kernel_positions, pitch, shift,
            bias.window if window else dummy, table, spans, kspan, lo, hi, n, s, H, rows, keys, H * s * n,
            ROW_TILE=cfg.block_m, KEY_TILE=cfg.block_n, CAUSAL=causal, QUERY_SIDE=query_side, HAS_DOCS=has_docs,
            WRITE_TABLE=index == 0, WINDOW=window)
        tables = (kspan, buffer[:1], buffer[:1], buffer[:1]) if window else (kspan, starts, lasts, spans)
        built.append(KernelTables((*tables, *fixed), consts, lo, hi))
    return built
