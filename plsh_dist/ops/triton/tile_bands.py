"""Which tiles the fused one-pass kernel visits: its tile shapes and band limits.

The Triton kernel (:mod:`plsh_dist.ops.triton.attention`) covers the (query,
key) plane with tiles. A query tile ``[i0, i1)`` of one head visits only the
key tiles that meet its band (docs/design.md, section 1, "The one-pass form"), and in backward a key tile only
the query tiles whose band meets it. This module computes those limits in
torch, on the tensors' device and without a host synchronisation, so that
the kernel's launcher and the cost model (:mod:`plsh_dist.plan.kernel_tiles`)
call the same function and count the same tiles. It imports no Triton: the one
launch here, the hash's draws made on the device (:meth:`CountBias.of`, ``by="kernels"``,
beside the host's ``by="torch"``), loads the table kernels when it is called.

Reach of a token ``i`` (hash head ``hh``):

- count bias (PLSH, fixed blocks): from the earliest first token of the s
  blocks holding ``i`` to one past their latest last token, each block cut
  to ``i``'s document; block bounds from the hash's own arithmetic
  (:func:`plsh_dist.hashing.bucket` and ``bucket_start``), so bit-identical to ``PositionalLSH``;
- ALiBi window bias: the tokens of ``i``'s document within ``w_h - 1``
  positions of it.

Block starts (and window starts) are monotone in the token, so a tile's
first token has the earliest reach and its last token the latest end.

Legend: n tokens, s samples, Hh bias heads (1 shared or Hq per head), m
tokens asked about, nq / nk query / key tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH, bucket, bucket_start, get_device_draw
from plsh_dist.ops.triton import device_draws  # noqa: F401  registers the package's samplers' device forms
from plsh_dist.ops.triton.cache import on_device
from plsh_dist.ops.triton.runtime import table_kernels as launch
from plsh_dist.ops.triton.token_layout import TokenLayout


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tile shape and launch shape: ``block_m`` queries by ``block_n`` keys."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


#: Shipped tiles, (compute capability major, head dim) -> (forward, dK/dV, dQ). Chosen with the
#: static cost model of the compiled code (``tools/triton_sass_model.py``, ``results/triton/sass.md``,
#: docs/gpu.md): on Hopper every product a wgmma (at least 64 rows a warpgroup, no warpgroup
#: repeating another's work: the dK/dV kernel's transposed tiles have the key tile's rows),
#: software-pipelined (cp.async), no register spill in a key loop, and the fewest clocks per score
#: over a band among those. Hopper's query tiles have 64 rows (one warpgroup): the tiles that meet a
#: query tile's rows count sample by sample up to 16 samples, and 64 rows halve them against 128.
TILES = {
    (9, 64): (TileConfig(64, 32, 4, 2), TileConfig(32, 128, 8, 2), TileConfig(64, 64, 4, 2)),
    (9, 128): (TileConfig(64, 32, 4, 2), TileConfig(32, 128, 8, 2), TileConfig(64, 32, 4, 2)),
    (8, 64): (TileConfig(128, 32, 8, 2), TileConfig(32, 32, 4, 2), TileConfig(128, 32, 8, 2)),
    (8, 128): (TileConfig(128, 32, 8, 2), TileConfig(32, 32, 4, 2), TileConfig(64, 32, 4, 2)),
}
#: Architectures the tiles are shipped for (Hopper, Ampere); newer ones use Hopper's.
ARCHS = (9, 8)
HEAD_DIMS = (64, 128)


def tiles_for(head_dim: int, arch: int = 9) -> tuple[TileConfig, TileConfig, TileConfig]:
    """(forward, dK/dV, dQ) tiles for ``head_dim`` (the smallest shipped dim >= it) on compute
    capability major ``arch`` (9 and above: Hopper's; the CPU interpreter uses Hopper's too)."""
    dims = [d for d in HEAD_DIMS if d >= head_dim]
    if not dims:
        raise ValueError(f"head_dim={head_dim} is above the Triton kernel's largest ({max(HEAD_DIMS)}); "
                         "use method='per_sample' or another backend")
    if arch < min(ARCHS):
        raise ValueError(f"the Triton kernel is built for compute capability >= {min(ARCHS)}.0, got {arch}.x")
    return TILES[(min(arch, max(ARCHS)), dims[0])]


#: hash_draw_kernel's lanes per program
_HASH_BLOCK = 256


@dataclass(frozen=True)
class CountBias:
    """The one-pass PLSH bias ``log c_ij``: the hash's pitch and shift on the device.

    Attributes:
        pitch, shift: float64 Tensor[s, Hh] (``PositionalLSH.pitch`` / ``.shift``).
    """

    pitch: torch.Tensor
    shift: torch.Tensor

    @classmethod
    def of(cls, lsh: PositionalLSH, device: torch.device, *, by: str = "torch") -> "CountBias":
        """``lsh``'s pitch and shift, float64 (s, Hh) on ``device``, drawn ``by`` one of two forms that
        give equal draws (``torch.equal`` under Triton's interpreter; compiled, the hash's ``log`` is
        CUDA's, libdevice, which may differ from the CPU's in its last bit: docs/gpu.md):

        - ``by="torch"``: the host's numpy draws (:attr:`PositionalLSH.pitch` / ``.shift``) copied to
          ``device``: the reference, and what the planner and the host's tests read;
        - ``by="kernels"``: drawn on ``device`` from the seed (:attr:`PositionalLSH.seed_tensor`) and
          sigma there, nothing read back; a host sigma is copied by the first call only
          (:func:`~plsh_dist.ops.triton.cache.on_device`), so a later call (a CUDA graph's capture)
          copies nothing. Fixed blocks and the "iid" sampler: one launch of ``hash_draw_kernel``.
          Other samplers: their device form's unit draws (:func:`plsh_dist.hashing.register_sampler`;
          the package's: :mod:`~plsh_dist.ops.triton.device_draws`) times sigma, the host's products.
          A sampler registered without a device form: its host draws on a CPU; elsewhere a ValueError.
        """
        if by not in ("torch", "kernels"):
            raise ValueError(f"a hash's draws are made by 'torch' or 'kernels', got {by!r}")
        if by == "torch":
            put = lambda x: x.to(device, torch.float64, non_blocking=True).contiguous()  # noqa: E731
            return cls(put(lsh.pitch), put(lsh.shift))
        device = torch.device(device)
        # a host sigma is copied once, so a later call (a CUDA graph's capture) copies nothing
        sigma = on_device(lsh.given[1], device).reshape(-1).to(torch.float64)
        if not lsh.fixed and lsh.sampler != "iid":
            device_draw = get_device_draw(lsh.sampler)
            if device_draw is None:
                if device.type == "cpu":
                    return cls.of(lsh, device)
                raise ValueError(
                    f"sampler {lsh.sampler!r} has no device form, and the fused kernel draws its masks on "
                    f"{device}: register one with it (register_sampler(name, draw, device_draw), see "
                    f"plsh_dist.hashing.SamplerDeviceDraw), or run another backend than the fused kernel")
            gamma, unit_shift = device_draw(lsh, device)
            pitch = gamma * sigma  # the host's products (PositionalLSH._draw), exact on every device
            return cls(pitch, unit_shift * pitch)
        s, H = lsh.num_samples, lsh.num_heads
        draws = torch.empty(2, s, H, dtype=torch.float64, device=device)
        seed = sigma if lsh.fixed else lsh.seed_tensor.to(device, non_blocking=True)  # FIXED reads no seed
        launch(device).hash_draw_kernel[(num_tiles(s * H, _HASH_BLOCK),)](
            seed, sigma, draws[0], draws[1], s, H, FIXED=lsh.fixed, BLOCK=_HASH_BLOCK)
        return cls(draws[0], draws[1])

    @property
    def num_heads(self) -> int:
        return self.pitch.shape[1]

    @property
    def num_samples(self) -> int:
        return self.pitch.shape[0]

    def bounds(self, layout: TokenLayout, tokens=slice(None), step: int = 0) -> torch.Tensor:
        """First position of bucket ``+ step`` of the blocks holding ``tokens`` (a slice or a
        LongTensor[m]), every head and sample at once: float64 (Hh, s, m) holding integers."""
        pitch, shift = self.pitch.T[:, :, None], self.shift.T[:, :, None]  # (Hh, s, 1)
        b = bucket(layout.positions[tokens], pitch, shift)
        return bucket_start(b + step if step else b, pitch, shift)


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def tile_index(n: int, largest: int, device) -> torch.Tensor:
    """LongTensor[n + largest - 1]: ``0..n-1`` then ``n - 1`` repeated. Indexing a token axis with
    its first ``num_tiles(n, size) * size`` entries (any ``size <= largest``) pads the last tile by
    repeating the last token: each tile's smallest and largest value and its last token are the
    real ones."""
    return torch.arange(n + largest - 1, device=device).clamp_(max=n - 1)


def _tile_lasts(index: torch.Tensor, n: int, size: int) -> torch.Tensor:
    """Last token of each tile of ``size`` (a view of :func:`tile_index`)."""
    return index[size - 1:num_tiles(n, size) * size:size]


def _min_max(padded: torch.Tensor, n: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest and largest value of each tile of ``size`` along the last axis of ``padded``
    (indexed by :func:`tile_index`), (..., num_tiles) each."""
    return padded[..., :num_tiles(n, size) * size].unflatten(-1, (-1, size)).aminmax(dim=-1)


class Reach:
    """How far the tokens at the ends of tiles reach, every bias head at once.

    ``first(size)``: LongTensor (Hh, num_tiles): earliest token seen by the first token of
    each tile of ``size``; ``last_end(size)``: one past the latest token seen by each tile's
    last token. Built by :meth:`CountReach.build` / :meth:`WindowReach.build`; ``index`` is
    the :func:`tile_index` of the layout."""

    layout: TokenLayout
    index: torch.Tensor
    _positions: torch.Tensor | None = None

    def key_spans(self, block_n: int) -> torch.Tensor:
        """:func:`key_spans` on this reach's :attr:`index` (the padded positions shared by every tile size)."""
        if self._positions is None:
            self._positions = self.layout.kernel_positions[self.index]
        return torch.stack(_min_max(self._positions, self.layout.n, block_n), -1)

    def _first(self, reached: torch.Tensor, size: int) -> torch.Tensor:
        """Token of the earliest virtual position ``reached`` (Hh, num_tiles) by each tile's first token."""
        tokens = slice(None, None, size)
        t = torch.searchsorted(self.layout.virtual, reached.contiguous())
        return t if self.layout.doc_first is None else torch.maximum(t, self.layout.doc_first[tokens])

    def _last_end(self, reached: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One past the token of the latest virtual position ``reached`` (Hh, m) by ``tokens``."""
        t = torch.searchsorted(self.layout.virtual, reached.contiguous(), right=True)
        return self.layout.clamp_end(t, tokens)


class CountReach(Reach):
    """The count's block bounds for one call, all heads and samples at once: the kernels'
    tables (:meth:`table`, :meth:`row_spans`) and the tiles' reach.

    Block starts (and window starts) are monotone in the token, and so is a position's token
    (``searchsorted``, then the document's clamp): the earliest token over the samples is the
    token of the earliest block start, so the samples are reduced before the search."""

    def __init__(self, layout: TokenLayout, index: torch.Tensor, causal: bool, starts: dict, lasts: dict,
                 table: torch.Tensor | None = None):
        """``starts`` / ``lasts``: tile size -> float64 (Hh, s, num_tiles) first / last position of the
        blocks holding each tile's first / last token; key None: every token's (Hh, s, n).
        ``table``: int32 (1 or 2, Hh, s, n), the starts (and lasts) clamped to int32."""
        self.layout, self.index, self.causal = layout, index, causal
        self._starts, self._lasts, self._table, self._padded = starts, lasts, table, None

    @classmethod
    def build(cls, bias: "CountBias", layout: TokenLayout, causal: bool, largest: int, end_sizes=()) -> "CountReach":
        """Every token's block bounds (the kernels' tables), and the block ends at the last
        tokens of the tiles of ``end_sizes`` (causal: the dK/dV kernel's key tiles), tiles of
        at most ``largest`` tokens."""
        n = layout.n
        index = tile_index(n, largest, layout.positions.device)
        pitch, shift = bias.pitch.T[:, :, None], bias.shift.T[:, :, None]  # (Hh, s, 1)
        b = bucket(layout.positions, pitch, shift)  # (Hh, s, n)
        if causal:  # the block ends only where a band needs them, after the starts on one axis
            tokens = [_tile_lasts(index, n, size) for size in end_sizes]
            ends = torch.cat(tokens) if len(tokens) > 1 else tokens[0] if tokens else index[:0]
            bounds = bucket_start(torch.cat([b, b[..., ends] + 1], -1), pitch, shift)  # (Hh, s, n + ends)
            bounds[..., n:] -= 1
            table = bounds[..., :n].clamp(INT32_MIN, INT32_MAX).to(torch.int32).contiguous()[None]
            lasts, at = {}, n
            for size, toks in zip(end_sizes, tokens):
                lasts[size], at = bounds[..., at:at + toks.numel()], at + toks.numel()
            return cls(layout, index, causal, {None: bounds[..., :n]}, lasts, table)
        bounds = bucket_start(torch.stack([b, b + 1]), pitch, shift)  # (2, Hh, s, n): starts, next starts
        bounds[1] -= 1
        table = bounds.clamp(INT32_MIN, INT32_MAX).to(torch.int32).contiguous()
        return cls(layout, index, causal, {None: bounds[0]}, {None: bounds[1]}, table)

    @classmethod
    def at_tiles(cls, bias: "CountBias", layout: TokenLayout, first_size: int, last_size: int | None) -> "CountReach":
        """Block bounds only at the first tokens of tiles of ``first_size`` and the last tokens of
        tiles of ``last_size`` (the bands alone, without the kernels' tables: O(s n / size))."""
        index = tile_index(layout.n, max(first_size, last_size or 1), layout.positions.device)
        starts = {first_size: bias.bounds(layout, slice(None, None, first_size))}
        lasts = {}
        if last_size is not None:
            lasts[last_size] = bias.bounds(layout, _tile_lasts(index, layout.n, last_size), step=1) - 1
        return cls(layout, index, True, starts, lasts)

    def first(self, size: int) -> torch.Tensor:
        starts = self._starts[size] if size in self._starts else self._starts[None][..., ::size]
        start = starts.amin(1).long()  # (Hh, nt): earliest block start
        if self.layout.doc is not None:
            tokens = slice(None, None, size)
            start = start + (self.layout.virtual[tokens] - self.layout.positions[tokens])
        return self._first(start, size)

    def last_end(self, size: int) -> torch.Tensor:
        tokens = _tile_lasts(self.index, self.layout.n, size)
        lasts = self._lasts[size] if size in self._lasts else self._lasts[None][..., tokens]
        last = lasts.amax(1).long()  # (Hh, nt): latest block last position
        if self.layout.doc is not None:
            last = last + self.layout.shift(tokens)
        return self._last_end(last, tokens)

    def table(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(starts, lasts): int32 (Hh, s, n) each, clamped to int32 (``lasts`` None when causal:
        ``p_j <= p_i`` is inside the block already)."""
        return self._table[0], None if self.causal else self._table[1]

    def padded_table(self) -> torch.Tensor:
        """The table indexed by :attr:`index`: int32 (1 or 2, Hh, s, n + largest - 1)."""
        if self._padded is None:
            self._padded = self._table[..., self.index]
        return self._padded

    def row_spans(self, block_m: int) -> torch.Tensor:
        """:func:`row_spans` of :meth:`table`."""
        return _row_spans(self.padded_table(), self.layout.n, block_m, self.causal)


class WindowReach(Reach):
    """The reach of tiles under a :class:`WindowBias`, every head at once."""

    def __init__(self, bias: "WindowBias", layout: TokenLayout, largest: int):
        self.layout, self.index = layout, tile_index(layout.n, largest, layout.positions.device)
        self._behind = bias.window[:, None] - 1  # (Hh, 1): farthest distance seen

    def first(self, size: int) -> torch.Tensor:
        return self._first(self.layout.virtual[::size] - self._behind, size)

    def last_end(self, size: int) -> torch.Tensor:
        tokens = _tile_lasts(self.index, self.layout.n, size)
        return self._last_end(self.layout.virtual[tokens] + self._behind, tokens)


def block_bounds(bias: "CountBias", layout: TokenLayout, causal: bool):
    """Every token's block per sample, as the kernels compare it: first and last position,
    int32 Tensors (Hh, s, n) each (``lasts`` None when causal: ``p_j <= p_i`` is inside already).

    From the hash's own float64 arithmetic (:func:`bucket_start`), all heads and samples at
    once; clamped to int32 (a block of a huge sigma reaches past any position the kernel
    holds: positions are in [0, 2^31))."""
    return CountReach.build(bias, layout, causal, 1).table()


def _row_spans(padded: torch.Tensor, n: int, block_m: int, causal: bool) -> torch.Tensor:
    mn, mx = _min_max(padded, n, block_m)
    parts = [mn[0], mx[0], mn[0], mx[0]] if causal else [mn[0], mx[0], mn[1], mx[1]]
    return torch.stack(parts, -1)


def row_spans(starts: torch.Tensor, lasts: torch.Tensor | None, block_m: int) -> torch.Tensor:
    """int32 (Hh, s, nq, 4): per query tile of ``block_m`` and sample, its rows' smallest and largest
    block start, then smallest and largest block last position (the starts again when ``lasts``
    is None): the kernels' per-tile test of whether a sample's blocks hold all, none or some keys."""
    n = starts.shape[-1]
    table = starts[None] if lasts is None else torch.stack([starts, lasts])
    return _row_spans(table[..., tile_index(n, block_m, starts.device)], n, block_m, lasts is None)


def key_spans(layout: TokenLayout, block_n: int, index: torch.Tensor | None = None) -> torch.Tensor:
    """int32 (nk, 2): smallest and largest position of each key tile of ``block_n`` (``index``: a
    :func:`tile_index` for tiles of at least ``block_n``)."""
    index = tile_index(layout.n, block_n, layout.positions.device) if index is None else index
    return torch.stack(_min_max(layout.kernel_positions[index], layout.n, block_n), -1)


@dataclass(frozen=True)
class WindowBias:
    """Exact ALiBi inside a per-head window: bias ``-|p_i - p_j| / sigma_h`` where
    ``|p_i - p_j| < window_h``, hidden elsewhere.

    Attributes:
        sigma: float32 Tensor[Hh] (``1 / slope_h``).
        window: int64 Tensor[Hh] >= 1 (keys at distance < window are seen).
    """

    sigma: torch.Tensor
    window: torch.Tensor

    @classmethod
    def of(cls, sigma: torch.Tensor, window: torch.Tensor, device: torch.device) -> "WindowBias":
        sigma = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1)
        window = torch.as_tensor(window, dtype=torch.int64).reshape(-1)
        if sigma.numel() != window.numel():
            raise ValueError(f"sigma ({sigma.numel()} heads) and window ({window.numel()} heads) must have one "
                             "entry per head each")
        if not bool(torch.isfinite(sigma).all()) or bool((sigma <= 0).any()):
            raise ValueError(f"sigma must be finite and > 0 for every head, got {sigma.tolist()}")
        if bool((window < 1).any()):
            raise ValueError(f"window must be >= 1 for every head, got {window.tolist()}")
        return cls(sigma.to(device).contiguous(), window.to(device).contiguous())

    @property
    def num_heads(self) -> int:
        return self.sigma.numel()


def query_bands(reach: Reach, block_m: int, block_n: int, causal: bool):
    """Key tiles ``[lo, hi)`` (in units of ``block_n``) that each query tile of ``block_m`` meets,
    int32 Tensors (Hh, nq) each, from ``reach`` (tiles of at most ``max(block_m, block_n)``)."""
    lo = reach.first(block_m)
    if causal:  # up to the tile's last token: (last + 1 + block_n - 1)
        end = (_tile_lasts(reach.index, reach.layout.n, block_m) + block_n).expand_as(lo)
    else:
        end = reach.last_end(block_m) + (block_n - 1)
    return torch.div(torch.stack([lo, end]), block_n, rounding_mode="floor").to(torch.int32).unbind(0)


def key_bands(reach: Reach, block_m: int, block_n: int, causal: bool):
    """Query tiles ``[lo, hi)`` (in units of ``block_m``) whose band meets each key tile of
    ``block_n``, int32 Tensors (Hh, nk) each, from ``reach``."""
    end = reach.last_end(block_n) + (block_m - 1)
    start = reach.index[:num_tiles(reach.layout.n, block_n) * block_n:block_n].expand_as(end) if causal \
        else reach.first(block_n)
    return torch.div(torch.stack([start, end]), block_m, rounding_mode="floor").to(torch.int32).unbind(0)


def query_tile_bands(bias, layout: TokenLayout, block_m: int, block_n: int, causal: bool):
    """Key tiles ``[lo, hi)`` (in units of ``block_n``) that each query tile of ``block_m`` meets.

    Returns int32 Tensors (Hh, nq) each, on the layout's device: the forward and
    dQ kernels loop over exactly these key tiles.
    """
    largest = max(block_m, block_n)
    if isinstance(bias, CountBias):
        reach = CountReach.at_tiles(bias, layout, block_m, None if causal else block_m)
    else:
        reach = WindowReach(bias, layout, largest)
    return query_bands(reach, block_m, block_n, causal)


def key_tile_bands(bias, layout: TokenLayout, block_m: int, block_n: int, causal: bool):
    """Query tiles ``[lo, hi)`` (in units of ``block_m``) whose band meets each key tile of
    ``block_n``: i sees j iff j sees i (blocks and windows are symmetric), and causally
    only queries at or after j. int32 Tensors (Hh, nk) each (the dK/dV kernel's loop)."""
    if isinstance(bias, CountBias):
        reach = CountReach.at_tiles(bias, layout, block_n, block_n)
    else:
        reach = WindowReach(bias, layout, max(block_m, block_n))
    return key_bands(reach, block_m, block_n, causal)


def num_tiles(n: int, size: int) -> int:
    """Tiles of ``size`` covering ``n`` tokens."""
    return math.ceil(n / size)
