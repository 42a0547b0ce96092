"""Tiles each PLSH path computes, device-independent: the fused Triton kernel against the
per-sample varlen path and the causal flash floor.

- fused kernel: the key tiles of every query tile's band, counted by
  :func:`plsh_dist.ops.triton.tile_bands.query_tile_bands`, the function the kernel's
  launcher builds its loop bounds with (a test holds the two together); its
  tiles are :data:`plsh_dist.ops.triton.tile_bands.TILES`' (Hopper's by default), so
  the comparison is in score area, ``FLASH_TILE x FLASH_TILE`` equivalents;
- per-sample varlen: every block of every (sample, head) is one sequence of a
  flash call, cut in ``FLASH_TILE x FLASH_TILE`` tiles from the block's own start
  (causal: the triangle of tiles), from the real block lengths of the hash;
- causal flash floor: one causal flash attention of T tokens per head.

One sequence of T tokens, positions ``0..T-1``; per query head (a shared hash
serves every head). Legend: s samples, Hq query heads, D head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.triton import (
    CountBias,
    TileConfig,
    TokenLayout,
    WindowBias,
    block_bounds,
    key_spans,
    key_tile_bands,
    query_tile_bands,
    row_spans,
    tiles_for,
)

#: Tile edge of the flash kernels the other paths run (flash-attn 2's 128 x 128 forward tile).
FLASH_TILE = 128


@dataclass(frozen=True)
class KernelTiles:
    """Tiles of the fused kernel, summed over the query heads of one sequence.

    Attributes:
        forward: (query tile, key tile) pairs the forward visits (its own tile shape).
        forward_area: score entries those tiles cover (the forward's computed q.k pairs).
        backward_area: score entries of the dK/dV kernel's tiles plus the dQ kernel's.
        backward_dkdv, backward_dq: (key tile, query tile) pairs the dK/dV kernel visits and
            (query tile, key tile) pairs the dQ kernel visits (each kernel's own tile shape).
        forward_far, backward_dkdv_far, backward_dq_far: those of them whose key tile is wholly
            before the query tile's rows (:func:`far_tiles`; the count's product form), 0 for a
            window bias (one loop).
    """

    forward: int
    forward_area: int
    backward_area: int
    backward_dkdv: int
    backward_dq: int
    forward_far: int = 0
    backward_dkdv_far: int = 0
    backward_dq_far: int = 0

    @property
    def flash_equivalent(self) -> float:
        """Forward area in ``FLASH_TILE x FLASH_TILE`` tiles."""
        return self.forward_area / FLASH_TILE**2


def kernel_tiles(lsh: PositionalLSH, T: int, num_q_heads: int, *, head_dim: int = 128, arch: int = 9,
                 causal: bool = True, tiles: tuple[TileConfig, TileConfig] | None = None) -> KernelTiles:
    """Tiles the fused kernel visits for one sequence of ``T`` tokens (module doc).

    ``tiles``: (forward, dK/dV, dQ) tile shapes (or (forward, backward): one for both) instead of the shipped ones for
    ``head_dim`` / ``arch`` (what another tiling would visit).
    """
    return bias_tiles(CountBias.of(lsh, torch.device("cpu")), T, num_q_heads, head_dim=head_dim, arch=arch,
                      causal=causal, tiles=tiles)


def window_tiles(sigma, window, T: int, num_q_heads: int, *, head_dim: int = 128, arch: int = 9,
                 causal: bool = True) -> KernelTiles:
    """Tiles the kernel visits for exact ALiBi inside per-head windows (``sigma``, ``window``:
    one entry per head, or one shared)."""
    sig = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1)
    win = torch.as_tensor(window, dtype=torch.int64).reshape(-1)
    H = max(sig.numel(), win.numel())
    bias = WindowBias.of(sig.expand(H).contiguous(), win.expand(H).contiguous(), torch.device("cpu"))
    return bias_tiles(bias, T, num_q_heads, head_dim=head_dim, arch=arch, causal=causal)


def bias_tiles(bias, T: int, num_q_heads: int, *, head_dim: int = 128, arch: int = 9, causal: bool = True,
               tiles: tuple[TileConfig, ...] | None = None) -> KernelTiles:
    """Tiles the kernel visits for ``bias`` (:class:`~plsh_dist.ops.triton.tile_bands.CountBias` or
    :class:`~plsh_dist.ops.triton.tile_bands.WindowBias` on the CPU) over positions ``0..T-1``."""
    layout = TokenLayout.build(torch.arange(T), torch.device("cpu"))
    heads_per_hash = num_q_heads // bias.num_heads
    fwd, kv, qt = _three(tiles if tiles is not None else tiles_for(head_dim, arch))
    lo, hi = query_tile_bands(bias, layout, fwd.block_m, fwd.block_n, causal)
    forward = int((hi - lo).long().sum()) * heads_per_hash
    k_lo, k_hi = key_tile_bands(bias, layout, kv.block_m, kv.block_n, causal)
    q_lo, q_hi = query_tile_bands(bias, layout, qt.block_m, qt.block_n, causal)
    dkdv = int((k_hi - k_lo).long().sum()) * heads_per_hash
    dq = int((q_hi - q_lo).long().sum()) * heads_per_hash
    far = (0, 0, 0)
    if isinstance(bias, CountBias):
        far = tuple(int(far_tiles(*band, kernel, c.block_m, c.block_n).sum()) * heads_per_hash
                    for band, kernel, c in (((lo, hi), "fwd", fwd), ((k_lo, k_hi), "bwd_dkdv", kv),
                                            ((q_lo, q_hi), "bwd_dq", qt)))
    return KernelTiles(forward, forward * fwd.block_m * fwd.block_n,
                       dkdv * kv.block_m * kv.block_n + dq * qt.block_m * qt.block_n, dkdv, dq, *far)


def far_tiles(lo: torch.Tensor, hi: torch.Tensor, kernel: str, block_m: int, block_n: int) -> torch.Tensor:
    """Per band (``lo``, ``hi``: (Hh, tiles) band limits of ``kernel``, "fwd", "bwd_dkdv" or "bwd_dq", at
    ``block_m`` x ``block_n``), how many of its tiles pair a key tile wholly before the query tile's
    first row (by token): the kernels' first loop (forward, dQ: key tiles below ``m block_m // block_n``)
    or second loop (dK/dV: query tiles from ``ceil((nt + 1) block_n / block_m)``), whose count is a
    product (``_count_before`` in the kernels); the other tiles count sample by sample (s <= 16) or as a
    product over the runs of blocks that meet them (beyond: :func:`block_trips`)."""
    lo, hi = lo.long(), hi.long()
    tile = torch.arange(lo.shape[-1])
    if kernel == "bwd_dkdv":
        after = torch.div((tile + 1) * block_n + block_m - 1, block_m, rounding_mode="floor")
        return (hi - torch.maximum(lo, after)).clamp(min=0)
    before = torch.div(tile * block_m, block_n, rounding_mode="floor")
    return (torch.minimum(hi, before) - lo).clamp(min=0)


def _three(tiles) -> tuple:
    """(forward, dK/dV, dQ) tiles from a pair (one backward tile for both kernels) or a triple."""
    return tuple(tiles) if len(tiles) == 3 else (tiles[0], tiles[1], tiles[1])


def boundary_share(bias: CountBias, T: int, kernel: str, block_m: int, block_n: int, causal: bool = True) -> float:
    """Share of the (visited tile, sample) pairs of ``kernel`` ("fwd", "bwd_dkdv", "bwd_dq") at
    tiles of ``block_m`` x ``block_n`` over positions ``0..T-1`` that count sample by sample (the
    tiles :func:`far_tiles` leaves) where the count's per-score block
    runs: the sample's blocks neither hold every key of the tile for every row nor miss them all
    (the kernels' own test, on the launcher's own tables :func:`~plsh_dist.ops.triton.tile_bands.row_spans`
    and :func:`~plsh_dist.ops.triton.tile_bands.key_spans`). One head at a time: O(s T) memory."""
    layout = TokenLayout.build(torch.arange(T), torch.device("cpu"))
    kspan = key_spans(layout, block_n).long()
    taken = total = 0
    for h in range(bias.num_heads):
        one = CountBias(bias.pitch[:, h:h + 1].contiguous(), bias.shift[:, h:h + 1].contiguous())
        spans = row_spans(*block_bounds(one, layout, causal), block_m)[0].long()  # (s, nq, 4)
        bands = key_tile_bands if kernel == "bwd_dkdv" else query_tile_bands
        lo, hi = (x[0].long() for x in bands(one, layout, block_m, block_n, causal))
        inner = lo[:, None] + torch.arange(max(int((hi - lo).max()), 1))
        valid = inner < hi[:, None]
        inner = torch.minimum(inner, hi[:, None] - 1).clamp(min=0)
        outer = torch.arange(lo.numel())[:, None].expand_as(inner)
        m, nt = (inner, outer) if kernel == "bwd_dkdv" else (outer, inner)
        valid = valid & ((nt + 1) * block_n > m * block_m)  # the far tiles count as a product
        sp, kmin, kmax = spans[:, m], kspan[nt, 0], kspan[nt, 1]
        every = sp[..., 1] <= kmin
        none = sp[..., 0] > kmax
        if not causal:
            every = every & (sp[..., 2] >= kmax)
            none = none | (sp[..., 3] < kmin)
        taken += int((~(every | none) & valid).sum())
        total += int(valid.sum()) * spans.shape[0]
    return taken / total


def block_trips(bias: CountBias, T: int, kernel: str, block_m: int, block_n: int, causal: bool = True,
                chunk: int = 16) -> float:
    """Mean trips of the near count's block loop (``_count_blocks`` in the kernels, ``chunk`` runs a trip)
    over the tiles of ``kernel`` ("fwd", "bwd_dkdv", "bwd_dq") at ``block_m`` x ``block_n`` that
    :func:`far_tiles` leaves, over positions ``0..T-1``: the runs holding the tile's anchor
    ``max(first row, first key)`` and those opening after it before the tile's row and key ends, read
    from the launcher's own table (:meth:`plsh_dist.ops.triton.near_runs.NearBlocks.of`) as the kernels
    read it. One head at a time."""
    from plsh_dist.ops.triton import NEAR_ANCHOR, NearBlocks  # noqa: PLC0415 (torch only)

    layout = TokenLayout.build(torch.arange(T), torch.device("cpu"))
    trips = tiles = 0
    for h in range(bias.num_heads):
        one = CountBias(bias.pitch[:, h:h + 1].contiguous(), bias.shift[:, h:h + 1].contiguous())
        starts, _ = block_bounds(one, layout, causal)
        table = NearBlocks.of(starts, None)
        offsets, enter = table.offsets[0].long(), table.enter_offsets[0].long()
        bands = key_tile_bands if kernel == "bwd_dkdv" else query_tile_bands
        lo, hi = (x[0].long() for x in bands(one, layout, block_m, block_n, causal))
        inner = lo[:, None] + torch.arange(max(int((hi - lo).max()), 1))
        valid = inner < hi[:, None]
        outer = torch.arange(lo.numel())[:, None].expand_as(inner)
        m, nt = (inner, outer) if kernel == "bwd_dkdv" else (outer, inner)
        valid = valid & ((nt + 1) * block_n > m * block_m)  # the far tiles count as a product
        x = torch.maximum(m * block_m, nt * block_n).clamp(max=T - 1)
        end = torch.minimum(torch.minimum(m * block_m + block_m, (nt + 1) * block_n), torch.tensor(T))
        a = torch.div(x, NEAR_ANCHOR, rounding_mode="floor")
        total = enter[a + 1] - enter[a] + offsets[torch.maximum(end, x + 1)] - offsets[x + 1]
        trips += int((torch.div(total + chunk - 1, chunk, rounding_mode="floor") * valid).sum())
        tiles += int(valid.sum())
    return trips / tiles if tiles else 0.0


def _block_tiles(lengths: torch.Tensor, causal: bool) -> int:
    m = torch.div(lengths + FLASH_TILE - 1, FLASH_TILE, rounding_mode="floor")
    return int((m * (m + 1) // 2).sum()) if causal else int((m * m).sum())


def per_sample_tiles(lsh: PositionalLSH, T: int, num_q_heads: int, *, causal: bool = True) -> int:
    """Flash tiles of the per-sample varlen path: every block of every (sample, head) one
    sequence, from the hash's real block lengths (one (sample, head) at a time: O(T) memory)."""
    positions = torch.arange(T)
    heads_per_hash = num_q_heads // lsh.num_heads
    total = 0
    for t in range(lsh.num_samples):
        b = lsh.sample_buckets(positions, t)  # (Hh, T)
        for h in range(b.shape[0]):
            total += _block_tiles(torch.bincount(b[h] - b[h, 0]), causal)
    return total * heads_per_hash


def floor_tiles(T: int, num_q_heads: int) -> int:
    """Flash tiles of one causal attention over ``T`` tokens, all heads."""
    m = math.ceil(T / FLASH_TILE)
    return num_q_heads * m * (m + 1) // 2
