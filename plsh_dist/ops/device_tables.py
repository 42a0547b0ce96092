"""The fused kernel's tables built on the device in a few launches, with no host read.

:func:`draw_on_device` gives a hash's pitch and shift on the attention's device from a
seed that may itself live there (a graph input); :func:`device_kernel_bias` gives the
:class:`~plsh_dist.ops.kernel_bias.KernelBias` of a count bias (block bounds, row and key
spans, band limits of the forward, dK/dV and dQ kernels) in three launches of
:func:`~plsh_dist.ops.table_kernels.band_tables_kernel` and one allocation. Both equal
their torch references (:class:`~plsh_dist.hashing.PositionalLSH`'s numpy draws,
:meth:`KernelBias.of`) bit for bit under Triton's interpreter; compiled, the hash's
``log`` is CUDA's (libdevice), which may differ from the CPU's in its last bit (docs/gpu.md).

Legend: n tokens, s samples, Hh bias heads.
"""

from __future__ import annotations

import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH
from plsh_dist.ops.kernel_bias import KernelBias, KernelTables, padded_samples
from plsh_dist.ops.tile_bands import CountBias, TileConfig, TokenLayout, num_tiles
from plsh_dist.ops.triton_runtime import launcher

#: samplers whose draws the device computes (others are drawn on the host and copied)
DEVICE_SAMPLERS = ("iid",)
_HASH_BLOCK = 256


def launch(device: torch.device):
    """The table kernels' module for tensors on ``device`` (tests wrap it to count host ops)."""
    return launcher("table_kernels", device)


def drawn_on_device(lsh: PositionalLSH) -> bool:
    """Whether :func:`draw_on_device` computes ``lsh``'s draws on the device (fixed blocks, the "iid"
    sampler) rather than on the host."""
    return isinstance(lsh, FixedBlocks) or lsh.sampler in DEVICE_SAMPLERS


def draw_on_device(lsh: PositionalLSH, device: torch.device) -> CountBias:
    """``lsh``'s pitch and shift, float64 (s, Hh) on ``device``, as a :class:`CountBias`.

    Fixed blocks and the "iid" sampler: one launch of ``hash_draw_kernel`` reading the seed
    (:attr:`PositionalLSH.seed_tensor`) and sigma on the device, nothing read back. Other samplers:
    the host's draws, copied (reading a device seed syncs)."""
    if not drawn_on_device(lsh):
        return CountBias.of(lsh, device)
    fixed = isinstance(lsh, FixedBlocks)
    s, H = lsh.num_samples, lsh.num_heads
    draws = torch.empty(2, s, H, dtype=torch.float64, device=device)
    sigma = lsh.sigma_on(device)
    seed = sigma if fixed else lsh.seed_tensor.to(device, non_blocking=True)  # FIXED reads no seed
    launch(device).hash_draw_kernel[(num_tiles(s * H, _HASH_BLOCK),)](
        seed, sigma, draws[0], draws[1], s, H, FIXED=fixed, BLOCK=_HASH_BLOCK)
    return CountBias(draws[0], draws[1])


def device_kernel_bias(bias: CountBias, layout: TokenLayout, causal: bool,
                       tiles: tuple[TileConfig, TileConfig, TileConfig]) -> KernelBias:
    """The :class:`KernelBias` of a count ``bias`` over ``layout`` for the (forward, dK/dV, dQ) ``tiles``,
    built on the layout's device: one int32 buffer, three launches (the first also writes every
    token's block bounds). Equal to ``KernelBias.of(bias, layout, causal, tiles)``."""
    n, s, H = layout.n, bias.num_samples, bias.num_heads
    device = layout.positions.device
    sides = ((tiles[0], True), (tiles[1], False), (tiles[2], True))
    table_rows = 1 if causal else 2
    sizes = [table_rows * H * s * n]
    for cfg, query_side in sides:
        rows, keys = num_tiles(n, cfg.block_m), num_tiles(n, cfg.block_n)
        sizes += [H * s * rows * 4, keys * 2, 2 * H * (rows if query_side else keys)]
    buffer = torch.empty(sum(sizes), dtype=torch.int32, device=device)
    parts = iter(buffer.split(sizes))
    table = next(parts).view(table_rows, H, s, n)
    starts, lasts = table[0], table[-1]
    has_docs = layout.doc is not None
    dummy = layout.positions  # an int64 pointer, never read
    # MODE 0 reads no sigma or window: views with the dtypes KernelBias.of gives, so the kernels keep one build
    no_sigma, no_window = buffer[:2].view(torch.float32), buffer[:2].view(torch.int64)
    mod = launch(device)
    consts = dict(MODE=0, NUM_SAMPLES=s, SAMPLES_PAD=padded_samples(s))
    built = []
    for index, (cfg, query_side) in enumerate(sides):
        rows, keys = num_tiles(n, cfg.block_m), num_tiles(n, cfg.block_n)
        spans = next(parts).view(H, s, rows, 4)
        kspan = next(parts).view(keys, 2)
        lo, hi = next(parts).view(2, H, rows if query_side else keys)
        mod.band_tables_kernel[(max(rows, keys), H)](
            layout.positions, layout.virtual, layout.doc_first if has_docs else dummy,
            layout.doc_end if has_docs else dummy, layout.kernel_positions, bias.pitch, bias.shift,
            table, spans, kspan, lo, hi, n, s, H, rows, keys, H * s * n,
            ROW_TILE=cfg.block_m, KEY_TILE=cfg.block_n, CAUSAL=causal, QUERY_SIDE=query_side, HAS_DOCS=has_docs,
            WRITE_TABLE=index == 0)
        built.append(KernelTables((kspan, starts, lasts, spans, no_sigma, no_window), consts, lo, hi))
    return KernelBias(bias, layout, causal, *built)
