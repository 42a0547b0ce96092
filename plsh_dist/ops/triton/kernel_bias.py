"""The fused kernel's view of a bias for one call: its tables and band limits, every head at once.

:class:`KernelBias` holds, for the forward, dK/dV and dQ kernels at their own tile
shapes, the arguments each kernel reads (block bounds and per-tile spans of a
:class:`~plsh_dist.ops.triton.tile_bands.CountBias`, or a
:class:`~plsh_dist.ops.triton.tile_bands.WindowBias`'s sigma and windows) and the band
limits of each tile. The launchers (:mod:`plsh_dist.ops.triton.attention`) read it; the
cache (:mod:`plsh_dist.ops.triton.cache`) shares one between calls with the same hash.

Legend: n tokens, s samples, Hh bias heads (1 shared, Hq per head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.ops.triton.tile_bands import (CountBias, CountReach, TileConfig, TokenLayout, WindowBias, WindowReach,
                                      key_bands, query_bands)


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
    def of(cls, bias, layout: TokenLayout, causal: bool,
           tiles: tuple[TileConfig, TileConfig, TileConfig]) -> "KernelBias":
        """The tables of ``bias`` over ``layout`` for the (forward, dK/dV, dQ) ``tiles``."""
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

        return cls(bias, layout, causal, tables(fwd, query_bands), tables(kv, key_bands), tables(qt, query_bands))
