"""The kernels' ``c_ij`` as a matrix, from their own device code (tests only: O(n^2)).

:func:`count_matrix` launches :func:`count_tile_kernel`, which counts every tile the
way the attention kernels do: a key tile wholly before the query tile's rows with
the product form (``_count_before_visible``), every other tile sample by sample
(``_count_tile``) or, beyond ``UNROLLED_SAMPLES`` samples, as a product over the blocks
that meet it (``_count_blocks``). Imported where Triton is importable; on CPU under the interpreter.
"""

import math

import torch
import triton
import triton.language as tl

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.triton.kernel_bias import KernelBias
from plsh_dist.ops.triton.tile_bands import CountBias, TileConfig
from plsh_dist.ops.triton.token_layout import TokenLayout
from plsh_dist.ops.triton.attention import kernels
from plsh_dist.ops.triton.call_tables import near_args as _near_args
from plsh_dist.ops.triton.kernels import (UNROLL_SAMPLES, _count_before_visible, _count_tile, _first_blocks,
                                                  _near_count, _visible)


@triton.jit
def count_tile_kernel(Out, Pos, Doc, KSpan, Starts, Lasts, Spans, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight,
                      n_tokens, num_m_tiles,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SAMPLES: tl.constexpr,
                      SAMPLES_PAD: tl.constexpr, CAUSAL: tl.constexpr, HAS_DOCS: tl.constexpr):
    """Grid (query tiles, key tiles, Hh): ``c_ij`` (0 where hidden), int32 (Hh, n, n)."""
    m = tl.program_id(0)
    nt = tl.program_id(1)
    hh = tl.program_id(2)
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = offs_m < n_tokens
    in_n = offs_n < n_tokens
    pos_n = tl.load(Pos + offs_n, mask=in_n, other=0)
    doc_m = tl.load(Doc + offs_m, mask=in_m, other=-1) if HAS_DOCS else offs_m
    doc_n = tl.load(Doc + offs_n, mask=in_n, other=-2) if HAS_DOCS else offs_n
    if (nt + 1) * BLOCK_N <= m * BLOCK_M:  # the kernels' far tiles
        r, a = _first_blocks(Starts, offs_m, in_m, m * BLOCK_M, hh, n_tokens, NUM_SAMPLES, SAMPLES_PAD, False)
        count = _count_before_visible(r, a, offs_m, pos_n, doc_m, doc_n, n_tokens, HAS_DOCS, False).to(tl.int32)
    elif NUM_SAMPLES <= UNROLL_SAMPLES:
        kmin = tl.load(KSpan + 2 * nt)
        kmax = tl.load(KSpan + 2 * nt + 1)
        anchor = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        count = _count_tile(anchor, offs_m, offs_n, pos_n, doc_m, doc_n, n_tokens, m, kmin, kmax, hh, num_m_tiles,
                            Starts, Lasts, Spans, NUM_SAMPLES, CAUSAL, HAS_DOCS, False).to(tl.int32)
    else:
        c = _near_count(offs_m, offs_n, BlockOff, EnterOff, BlockFirst, BlockEnd, BlockWeight, m * BLOCK_M,
                        nt * BLOCK_N, tl.minimum(m * BLOCK_M + BLOCK_M, n_tokens),
                        tl.minimum((nt + 1) * BLOCK_N, n_tokens), hh, n_tokens, False)
        count = tl.where(_visible(offs_m, offs_n, doc_m, doc_n, n_tokens, CAUSAL, HAS_DOCS, False), c.to(tl.int32), 0)
    ptr = Out + hh.to(tl.int64) * n_tokens * n_tokens + offs_m.to(tl.int64)[:, None] * n_tokens + offs_n[None, :]
    tl.store(ptr, count, mask=in_m[:, None] & in_n[None, :])


def count_matrix(lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool, docs: Documents | None = None,
                 block: int = 32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The kernels' ``c_ij``, int32 (Hh, n, n) on CPU, 0 where hidden; on CPU under the
    interpreter, or compiled on CUDA. ``block``: the square tile (small: many far tiles)."""
    device = torch.device(device)
    kernels()  # the interpreter's compatibility patch, where it needs one
    layout = TokenLayout.build(positions, device, docs)
    bias = CountBias.of(lsh, device)
    n, H = layout.n, bias.num_heads
    out = torch.zeros(H, n, n, dtype=torch.int32, device=device)
    tile = TileConfig(block, block, 4, 1)
    kb = KernelBias.of(bias, layout, causal, (tile, tile, tile))
    t = kb.fwd
    doc = layout.doc if layout.doc is not None else layout.kernel_positions
    nt = math.ceil(n / block)
    count_tile_kernel[(nt, nt, H)](
        out, layout.kernel_positions, doc, *t.args[:4], *_near_args(kb, device), n, nt, BLOCK_M=block, BLOCK_N=block,
        NUM_SAMPLES=t.consts["NUM_SAMPLES"], SAMPLES_PAD=t.consts["SAMPLES_PAD"], CAUSAL=causal,
        HAS_DOCS=layout.doc is not None,
    )
    return out.cpu()
