"""Which tiles the fused one-pass kernel visits: its tile shapes and band limits.

The Triton kernel (:mod:`plsh_dist.ops.triton_onepass`) covers the (query,
key) plane with tiles. A query tile ``[i0, i1)`` of one head visits only the
key tiles that meet its band (docs/design.md, section 1, "The one-pass form"), and in backward a key tile only
the query tiles whose band meets it. This module computes those limits in
torch, on the tensors' device and without a host synchronisation, so that
the kernel's launcher and the cost model (:mod:`plsh_dist.plan.kernel_tiles`)
call the same function and count the same tiles. It imports no Triton.

Reach of a token ``i`` (hash head ``hh``):

- count bias (PLSH, fixed blocks): from the earliest first token of the s
  blocks holding ``i`` to one past their latest last token, each block cut
  to ``i``'s document; block bounds from the hash's own arithmetic
  (:func:`plsh_dist.hashing._bucket`), so bit-identical to ``PositionalLSH``;
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

from plsh_dist.hashing import PositionalLSH, _bucket

__all__ = ["TileConfig", "TILES", "tiles_for", "TokenLayout", "CountBias", "WindowBias",
           "query_tile_bands", "key_tile_bands", "bucket_start_nosync", "num_tiles", "block_bounds", "row_spans",
           "key_spans"]


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tile shape and launch shape: ``block_m`` queries by ``block_n`` keys."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


#: Shipped tiles, (compute capability major, head dim) -> (forward, dK/dV, dQ). Chosen with the
#: static cost model of the compiled code (``launchers/triton_sass_model.py``, ``results/triton/sass.md``,
#: docs/gpu.md): on Hopper every product a wgmma (at least 64 rows a warpgroup, no warpgroup
#: repeating another's work: the dK/dV kernel's transposed tiles have the key tile's rows),
#: software-pipelined (cp.async), no register spills, and the fewest clocks per score among
#: those. Larger tiles spill (the count's per-sample block bounds add registers to flash's).
TILES = {
    (9, 64): (TileConfig(128, 32, 8, 2), TileConfig(32, 128, 8, 2), TileConfig(128, 64, 8, 2)),
    (9, 128): (TileConfig(128, 32, 8, 2), TileConfig(32, 128, 8, 2), TileConfig(128, 32, 8, 2)),
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


@dataclass(frozen=True)
class TokenLayout:
    """The tokens of one row, on the kernel's device.

    Attributes:
        positions: LongTensor[n], the hash's positions (restarting per document allowed).
        virtual: LongTensor[n], strictly increasing: positions plus a per-document constant
            (:attr:`plsh_dist.ops.documents.Documents.virtual_positions`), so a position
            maps to a token by ``searchsorted``.
        kernel_positions: IntTensor[n], the positions as the kernels read them (int32).
        doc: IntTensor[n] document index of every token, or None (one document).
        doc_first, doc_end: LongTensor[n], first token and one past the last of each
            token's document, or None.
    """

    positions: torch.Tensor
    virtual: torch.Tensor
    kernel_positions: torch.Tensor
    doc: torch.Tensor | None = None
    doc_first: torch.Tensor | None = None
    doc_end: torch.Tensor | None = None

    @classmethod
    def build(cls, positions: torch.Tensor, device: torch.device, docs=None) -> "TokenLayout":
        """From CPU positions (LongTensor[n], increasing within each document) and optional
        :class:`~plsh_dist.ops.documents.Documents` of the same row."""
        put = lambda x: x.to(device, torch.int64, non_blocking=True)  # noqa: E731
        pos = positions if docs is None else docs.positions
        if pos.numel() and int(pos.max()) >= 2**31:  # CPU positions: no device sync
            raise ValueError(f"positions must be below 2^31 for the Triton kernel, got {int(pos.max())}")
        if docs is None:
            pos = put(positions)
            return cls(pos, pos, pos.to(torch.int32))
        pos = put(docs.positions)
        return cls(pos, put(docs.virtual_positions), pos.to(torch.int32), put(docs.ids).to(torch.int32),
                   put(docs.first), put(docs.end))

    @property
    def n(self) -> int:
        return self.positions.numel()

    def token_at(self, virtual: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """First token whose virtual position is >= ``virtual`` (positions of ``tokens``' own
        documents, shape like ``tokens`` or broadcasting with it), clamped to ``tokens``' document."""
        t = torch.searchsorted(self.virtual, virtual.contiguous())
        return t if self.doc_first is None else torch.maximum(t, self.doc_first[tokens])

    def clamp_end(self, end: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return end if self.doc_end is None else torch.minimum(end, self.doc_end[tokens])

    def shift(self, tokens: torch.Tensor) -> torch.Tensor:
        """Virtual minus real position of ``tokens`` (their document's constant)."""
        return self.virtual[tokens] - self.positions[tokens]


def bucket_start_nosync(b: torch.Tensor, pitch: torch.Tensor, shift: torch.Tensor, rounds: int = 4) -> torch.Tensor:
    """:func:`plsh_dist.hashing._bucket_start` without its convergence check (a host sync on
    CUDA): the float estimate is off by at most one position (one ulp's worth at a
    boundary), and each round moves it one step towards the hash's own rule; the tests
    hold the result equal to ``PositionalLSH.block_bounds``."""
    c = torch.ceil(shift + b.to(torch.float64) * pitch).to(torch.long)
    for _ in range(rounds):
        c = c - (_bucket(c - 1, pitch, shift) >= b).long() + (_bucket(c, pitch, shift) < b).long()
    return c


@dataclass(frozen=True)
class CountBias:
    """The one-pass PLSH bias ``log c_ij``: the hash's pitch and shift on the device.

    Attributes:
        pitch, shift: float64 Tensor[s, Hh] (``PositionalLSH.pitch`` / ``.shift``).
    """

    pitch: torch.Tensor
    shift: torch.Tensor

    @classmethod
    def of(cls, lsh: PositionalLSH, device: torch.device) -> "CountBias":
        put = lambda x: x.to(device, torch.float64, non_blocking=True).contiguous()  # noqa: E731
        return cls(put(lsh.pitch), put(lsh.shift))

    @property
    def num_heads(self) -> int:
        return self.pitch.shape[1]

    @property
    def num_samples(self) -> int:
        return self.pitch.shape[0]

    def reach(self, layout: TokenLayout, tokens: torch.Tensor, head: int) -> torch.Tensor:
        """Earliest first token of the blocks holding ``tokens`` (LongTensor[m]), LongTensor[m]."""
        pitch, shift = self.pitch[:, head, None], self.shift[:, head, None]  # (s, 1)
        b = _bucket(layout.positions[tokens][None], pitch, shift)  # (s, m)
        start = bucket_start_nosync(b, pitch, shift) + layout.shift(tokens)[None]
        return layout.token_at(start, tokens.expand_as(start)).amin(dim=0)

    def reach_end(self, layout: TokenLayout, tokens: torch.Tensor, head: int) -> torch.Tensor:
        """One past the latest last token of the blocks holding ``tokens``, LongTensor[m]."""
        pitch, shift = self.pitch[:, head, None], self.shift[:, head, None]
        b = _bucket(layout.positions[tokens][None], pitch, shift)
        end = bucket_start_nosync(b + 1, pitch, shift) + layout.shift(tokens)[None]
        return layout.clamp_end(torch.searchsorted(layout.virtual, end.contiguous()), tokens).amax(dim=0)


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def block_bounds(bias: "CountBias", layout: TokenLayout, causal: bool):
    """Every token's block per sample, as the kernels compare it: first and last position,
    int32 Tensors (Hh, s, n) each (``lasts`` None when causal: ``p_j <= p_i`` is inside already).

    From the hash's own float64 arithmetic (:func:`bucket_start_nosync`), all heads and
    samples at once; clamped to int32 (a block of a huge sigma reaches past any position the
    kernel holds: positions are in [0, 2^31))."""
    pitch, shift = bias.pitch.T[:, :, None], bias.shift.T[:, :, None]  # (Hh, s, 1)
    b = _bucket(layout.positions[None, None], pitch, shift)  # (Hh, s, n)
    starts = bucket_start_nosync(b, pitch, shift).clamp(INT32_MIN, INT32_MAX).to(torch.int32).contiguous()
    if causal:
        return starts, None
    lasts = (bucket_start_nosync(b + 1, pitch, shift) - 1).clamp(INT32_MIN, INT32_MAX).to(torch.int32).contiguous()
    return starts, lasts


def row_spans(starts: torch.Tensor, lasts: torch.Tensor | None, block_m: int) -> torch.Tensor:
    """int32 (Hh, s, nq, 4): per query tile of ``block_m`` and sample, its rows' smallest and largest
    block start, then smallest and largest block last position (the starts again when ``lasts``
    is None): the kernels' per-tile test of whether a sample's blocks hold all, none or some keys."""
    n = starts.shape[-1]
    pad = num_tiles(n, block_m) * block_m - n
    lasts = starts if lasts is None else lasts
    tiles = lambda x, fill: torch.nn.functional.pad(x, (0, pad), value=fill).unflatten(-1, (-1, block_m))  # noqa: E731
    return torch.stack([tiles(starts, INT32_MAX).amin(-1), tiles(starts, INT32_MIN).amax(-1),
                        tiles(lasts, INT32_MAX).amin(-1), tiles(lasts, INT32_MIN).amax(-1)], -1).contiguous()


def key_spans(layout: TokenLayout, block_n: int) -> torch.Tensor:
    """int32 (nk, 2): smallest and largest position of each key tile of ``block_n``."""
    pos = layout.kernel_positions
    pad = num_tiles(layout.n, block_n) * block_n - layout.n
    tiles = lambda fill: torch.nn.functional.pad(pos, (0, pad), value=fill).unflatten(-1, (-1, block_n))  # noqa: E731
    return torch.stack([tiles(INT32_MAX).amin(-1), tiles(INT32_MIN).amax(-1)], -1).contiguous()


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

    def reach(self, layout: TokenLayout, tokens: torch.Tensor, head: int) -> torch.Tensor:
        return layout.token_at(layout.virtual[tokens] - (self.window[head] - 1), tokens)

    def reach_end(self, layout: TokenLayout, tokens: torch.Tensor, head: int) -> torch.Tensor:
        end = torch.searchsorted(layout.virtual, (layout.virtual[tokens] + self.window[head]).contiguous())
        return layout.clamp_end(end, tokens)


def _tiles(n: int, size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    first = torch.arange(0, n, size, device=device)
    return first, torch.clamp(first + size, max=n) - 1


def query_tile_bands(bias, layout: TokenLayout, block_m: int, block_n: int, causal: bool):
    """Key tiles ``[lo, hi)`` (in units of ``block_n``) that each query tile of ``block_m`` meets.

    Returns int32 Tensors (Hh, nq) each, on the layout's device: the forward and
    dQ kernels loop over exactly these key tiles.
    """
    first, last = _tiles(layout.n, block_m, layout.positions.device)
    lo, hi = [], []
    for h in range(bias.num_heads):
        lo.append(torch.div(bias.reach(layout, first, h), block_n, rounding_mode="floor"))
        end = last + 1 if causal else bias.reach_end(layout, last, h)
        hi.append(torch.div(end + block_n - 1, block_n, rounding_mode="floor"))
    return torch.stack(lo).to(torch.int32), torch.stack(hi).to(torch.int32)


def key_tile_bands(bias, layout: TokenLayout, block_m: int, block_n: int, causal: bool):
    """Query tiles ``[lo, hi)`` (in units of ``block_m``) whose band meets each key tile of
    ``block_n``: i sees j iff j sees i (blocks and windows are symmetric), and causally
    only queries at or after j. int32 Tensors (Hh, nk) each (the dK/dV kernel's loop)."""
    first, last = _tiles(layout.n, block_n, layout.positions.device)
    lo, hi = [], []
    for h in range(bias.num_heads):
        start = first if causal else bias.reach(layout, first, h)
        lo.append(torch.div(start, block_m, rounding_mode="floor"))
        end = bias.reach_end(layout, last, h)
        hi.append(torch.div(end + block_m - 1, block_m, rounding_mode="floor"))
    return torch.stack(lo).to(torch.int32), torch.stack(hi).to(torch.int32)


def num_tiles(n: int, size: int) -> int:
    """Tiles of ``size`` covering ``n`` tokens."""
    return math.ceil(n / size)
