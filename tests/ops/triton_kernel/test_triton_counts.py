"""The Triton kernel's blocks are the hash's: its count matrix equals the brute-force count
from ``PositionalLSH.buckets`` (``torch.equal``) for every shipped sampler and fixed blocks,
and the tiles it visits are exactly those that hold a non-zero count.

Runs under Triton's CPU interpreter (``tests/conftest.py`` switches it on before triton
is imported), or compiled on a GPU where there is one."""

import pytest
import torch

pytest.importorskip("triton")

from plsh_dist.hashing import FixedBlocks, PositionalLSH, sampler_names  # noqa: E402
from plsh_dist.ops.documents import Documents  # noqa: E402
from plsh_dist.ops.triton.tile_bands import (TILES, CountBias, WindowBias, key_tile_bands,  # noqa: E402
                                      query_tile_bands)
from plsh_dist.ops.triton.token_layout import TokenLayout  # noqa: E402

from count_kernel import count_matrix  # noqa: E402
from kernel_cases import brute_counts, kernel_device, window_weights  # noqa: E402

SIGMA = torch.tensor([0.8, 3.0, 40.0, 700.0], dtype=torch.float64)  # per head: 1-token blocks to longer than n


def _lsh(sampler: str):
    return FixedBlocks(SIGMA) if sampler == "fixed" else PositionalLSH(SIGMA, 8, seed=11, sampler=sampler)


def _documents(n: int) -> Documents:
    """Documents with 1-token ones and positions restarting at each document start."""
    cu = torch.tensor([0, 1, 2, 40, 41, 97, n])
    lengths = cu[1:] - cu[:-1]
    pos = torch.cat([torch.arange(int(L)) + 5 * i for i, L in enumerate(lengths)])  # restarts (not at 0 everywhere)
    return Documents.from_cu_seqlens(cu, pos)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("sampler", [*sampler_names(), "fixed"])
def test_count_matrix_equals_hash(sampler, causal):
    lsh = _lsh(sampler)
    positions = 1000 + torch.arange(130)  # an SP rank's chunk: absolute positions offset
    got = count_matrix(lsh, positions, causal=causal, device=kernel_device())
    assert torch.equal(got, brute_counts(lsh, positions, causal))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("samples", [17, 100])
def test_count_matrix_at_large_s_equals_hash(samples, causal):
    """Beyond 16 samples a near tile counts as a product over the runs of blocks that meet it: sigma
    0.8 and 3 cut every 32-token tile many times in every sample (1-token blocks repeat across samples
    and merge), 700 holds the tile whole; tiles of 16 and 32 put the anchor on every kind of edge."""
    lsh = PositionalLSH(SIGMA, samples, seed=13)
    positions = 1000 + torch.arange(130)
    for block in (16, 32):
        got = count_matrix(lsh, positions, causal=causal, block=block, device=kernel_device())
        assert torch.equal(got, brute_counts(lsh, positions, causal))


def test_count_matrix_at_large_s_documents_and_gaps():
    lsh = PositionalLSH(SIGMA, 40, seed=4)
    docs = _documents(120)  # 1-token documents and positions restarting inside tiles
    for causal in (True, False):
        got = count_matrix(lsh, docs.positions, causal=causal, docs=docs, device=kernel_device())
        assert torch.equal(got, brute_counts(lsh, docs.positions, causal, docs))
    gapped = torch.cumsum(torch.randint(1, 4, (90,), generator=torch.Generator().manual_seed(0)), 0)
    got = count_matrix(lsh, gapped, causal=True, device=kernel_device())
    assert torch.equal(got, brute_counts(lsh, gapped, True))


def test_count_matrix_documents_and_gaps():
    lsh = PositionalLSH(SIGMA, 5, seed=3)
    docs = _documents(120)
    for causal in (True, False):
        got = count_matrix(lsh, docs.positions, causal=causal, docs=docs, device=kernel_device())
        assert torch.equal(got, brute_counts(lsh, docs.positions, causal, docs))
    gapped = torch.cumsum(torch.randint(1, 4, (90,), generator=torch.Generator().manual_seed(0)), 0)
    got = count_matrix(lsh, gapped, causal=False, device=kernel_device())
    assert torch.equal(got, brute_counts(lsh, gapped, False))


def _assert_bands_tight(weights: torch.Tensor, bias, layout: TokenLayout, causal: bool):
    """Every non-zero weight lies in a visited tile, and each band's first and last tile hold one."""
    n = layout.n
    for cfg in {c for pair in TILES.values() for c in pair}:
        bm, bn = cfg.block_m, cfg.block_n
        lo, hi = query_tile_bands(bias, layout, bm, bn, causal)
        k_lo, k_hi = key_tile_bands(bias, layout, bm, bn, causal)
        for h in range(weights.shape[0]):
            for m in range((n + bm - 1) // bm):
                cols = torch.nonzero(weights[h, m * bm:(m + 1) * bm].any(dim=0)).flatten()
                assert int(lo[h, m]) == int(cols.min()) // bn and int(hi[h, m]) == int(cols.max()) // bn + 1
            for t in range((n + bn - 1) // bn):
                rows = torch.nonzero(weights[h, :, t * bn:(t + 1) * bn].any(dim=1)).flatten()
                assert int(k_lo[h, t]) == int(rows.min()) // bm and int(k_hi[h, t]) == int(rows.max()) // bm + 1


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_bands_are_exactly_the_nonzero_tiles(causal):
    lsh = PositionalLSH(SIGMA, 8, seed=5, sampler="stratified_ramp")
    positions = 77 + torch.arange(300)
    layout = TokenLayout.build(positions, torch.device("cpu"))
    _assert_bands_tight(brute_counts(lsh, positions, causal), CountBias.of(lsh, torch.device("cpu")), layout, causal)
    docs = _documents(150)
    layout = TokenLayout.build(docs.positions, torch.device("cpu"), docs)
    _assert_bands_tight(brute_counts(lsh, docs.positions, causal, docs), CountBias.of(lsh, torch.device("cpu")),
                        layout, causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_window_bands_are_exactly_the_nonzero_tiles(causal):
    sigma = torch.tensor([1.0, 8.0, 60.0, 900.0])
    window = torch.tensor([1, 7, 70, 1000])
    docs = _documents(200)
    layout = TokenLayout.build(docs.positions, torch.device("cpu"), docs)
    w = window_weights(sigma, window, docs.positions, causal, docs)
    _assert_bands_tight(w, WindowBias.of(sigma, window, torch.device("cpu")), layout, causal)


def test_positions_beyond_int32_are_refused():
    with pytest.raises(ValueError, match="below 2\\^31"):
        TokenLayout.build(torch.tensor([2**31, 2**31 + 1]), torch.device("cpu"))
