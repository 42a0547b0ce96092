"""The fused kernel's cost model (plsh_dist/plan/kernel_tiles.py): its tile counts are the
tiles that hold a non-zero count of the real hash, the kernel's launcher builds its loops from
the same band function, and the per-sample / floor counts are the flash tiles of real blocks."""

import math

import pytest
import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes
from plsh_dist.models import AttentionConfig
from plsh_dist.ops.triton.tile_bands import tiles_for
from plsh_dist.plan.attention_cost import attention_cost, attention_flops, fused_tiles
from plsh_dist.plan.kernel_tiles import FLASH_TILE, far_tiles, floor_tiles, kernel_tiles, per_sample_tiles

torch.set_num_threads(1)
SIGMA = alibi_slopes(4).double().reciprocal() * 8  # 2.8 .. 32 tokens


def _nonzero_tiles(lsh, T, bm, bn) -> int:
    """(query tile, key tile) pairs holding a key that shares a block with a query (causal), per head."""
    b = lsh.buckets(torch.arange(T))  # (s, Hh, T)
    same = (b[:, :, :, None] == b[:, :, None, :]).any(0) & torch.ones(T, T, dtype=torch.bool).tril()
    nq, nk = math.ceil(T / bm), math.ceil(T / bn)
    pad = torch.zeros(same.shape[0], nq * bm, nk * bn, dtype=torch.bool)
    pad[:, :T, :T] = same
    return int(pad.view(-1, nq, bm, nk, bn).any(dim=(2, 4)).sum())


@pytest.mark.parametrize("sampler", ["iid", "stratified"])
def test_kernel_tiles_are_the_tiles_with_a_count(sampler):
    T, lsh = 300, PositionalLSH(SIGMA, 8, seed=4, sampler=sampler)
    fwd, kv, qt = tiles_for(128)
    got = kernel_tiles(lsh, T, 4, head_dim=128)
    assert got.forward == _nonzero_tiles(lsh, T, fwd.block_m, fwd.block_n)
    assert got.forward_area == got.forward * fwd.block_m * fwd.block_n
    # backward: the dQ kernel's pairs plus the dK/dV kernel's (each at its own tile shape; the same set,
    # seen from the keys, where the shapes agree)
    assert got.backward_dkdv == _nonzero_tiles(lsh, T, kv.block_m, kv.block_n)
    assert got.backward_dq == _nonzero_tiles(lsh, T, qt.block_m, qt.block_n)
    assert got.backward_area == (got.backward_dkdv * kv.block_m * kv.block_n
                                 + got.backward_dq * qt.block_m * qt.block_n)
    shared = PositionalLSH(6.0, 3, seed=1)
    assert kernel_tiles(shared, T, 4).forward == 4 * _nonzero_tiles(shared, T, fwd.block_m, fwd.block_n)


def test_the_kernel_loops_over_the_counted_tiles(monkeypatch):
    """The launcher's band (its kernel's loop bounds) is the cost model's."""
    pytest.importorskip("triton")
    from plsh_dist.ops.triton import attention as triton_onepass

    if not triton_onepass.interpreting():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1 before triton is imported)")
    from plsh_dist.ops.triton import cache as kernel_bias_cache

    seen = []
    real = triton_onepass.banded_forward

    def spy(*args, kernel_bias, **kwargs):  # the forward kernel's loop bounds, as the launcher passes them
        seen.append(int((kernel_bias.fwd.hi - kernel_bias.fwd.lo).long().sum()))
        return real(*args, kernel_bias=kernel_bias, **kwargs)

    kernel_bias_cache.clear()  # the kernel bias is built here, not found from another test's call
    monkeypatch.setattr(triton_onepass, "banded_forward", spy)
    T, lsh = 200, PositionalLSH(SIGMA, 4, seed=2)
    q, k, v = (torch.randn(1, T, 4, 128) for _ in range(3))
    triton_onepass.triton_onepass_forward(q, k, v, lsh, torch.arange(T), causal=True, scale=0.1)
    assert seen == [kernel_tiles(lsh, T, 4, head_dim=128).forward]


def _far_pairs(lsh, T, bm, bn, kernel) -> int:
    """Brute force: counted pairs whose key tile ends at or before the query tile's first token."""
    b = lsh.buckets(torch.arange(T))
    same = (b[:, :, :, None] == b[:, :, None, :]).any(0) & torch.ones(T, T, dtype=torch.bool).tril()
    far = 0
    for m in range(math.ceil(T / bm)):
        for nt in range(math.ceil(T / bn)):
            if (nt + 1) * bn <= m * bm and same[:, m * bm:(m + 1) * bm, nt * bn:(nt + 1) * bn].any():
                far += int(same[:, m * bm:(m + 1) * bm, nt * bn:(nt + 1) * bn].flatten(1).any(1).sum())
    return far


def test_far_tiles_are_the_key_tiles_wholly_before_the_rows():
    T, lsh = 300, PositionalLSH(SIGMA * 4, 8, seed=4)
    fwd, kv, qt = tiles_for(128)
    got = kernel_tiles(lsh, T, 4, head_dim=128)
    assert got.forward_far == _far_pairs(lsh, T, fwd.block_m, fwd.block_n, "fwd") > 0
    assert got.backward_dkdv_far == _far_pairs(lsh, T, kv.block_m, kv.block_n, "bwd_dkdv") > 0
    assert got.backward_dq_far == _far_pairs(lsh, T, qt.block_m, qt.block_n, "bwd_dq") > 0
    # one band by hand: query tile 3 of 128 rows, key tiles of 32 from 2 to 14: 2..11 are before row 384
    lo, hi = torch.tensor([[0, 0, 0, 2]]), torch.tensor([[4, 8, 12, 14]])
    assert far_tiles(lo, hi, "fwd", 128, 32).tolist() == [[0, 4, 8, 10]]
    # dK/dV: key tile 1 of 128 (tokens 128..255), query tiles of 32 from 0 to 20: 8.. are after it
    assert far_tiles(torch.tensor([[0, 3]]), torch.tensor([[20, 20]]), "bwd_dkdv", 32, 128).tolist() == [[16, 12]]


def test_per_sample_and_floor_tiles():
    assert floor_tiles(8192, 16) == 16 * 64 * 65 // 2 == 33280
    # fixed blocks of 2 * 100 tokens: 5 blocks of 2 x 2 flash tiles (3 causal), on 2 heads
    assert per_sample_tiles(FixedBlocks(100.0), 1000, 2) == 2 * 5 * 3
    assert per_sample_tiles(FixedBlocks(100.0), 1000, 2, causal=False) == 2 * 5 * 4
    lsh = PositionalLSH(SIGMA * 20, 3, seed=0)
    expected = 0
    for per_sample in lsh.cu_seqlens(torch.arange(2000)):
        for cu in per_sample:
            m = torch.div((cu[1:] - cu[:-1]).long() + FLASH_TILE - 1, FLASH_TILE, rounding_mode="floor")
            expected += int((m * (m + 1) // 2).sum())
    assert per_sample_tiles(lsh, 2000, 4) == expected


def test_planner_counts_the_fused_kernels_tiles(monkeypatch):
    from plsh_dist.ops.triton import attention as triton_onepass

    monkeypatch.setattr(triton_onepass, "triton_status", lambda: None)  # a GPU machine with Triton
    attn = AttentionConfig(bias="plsh", num_samples=8)
    cost = attention_cost(attn, 4, "cuda", torch.bfloat16)
    assert cost.setup.fused and cost.setup.onepass and not cost.setup.varlen
    tiles = fused_tiles(cost, 512, 64)
    assert attention_flops(cost, 512, 64, False) == 64 * (4 * tiles.forward_area + 7 * tiles.backward_area)
    assert attention_flops(cost, 512, 64, True) == 64 * (8 * tiles.forward_area + 7 * tiles.backward_area)
    monkeypatch.setattr(triton_onepass, "triton_status", lambda: "missing")
    assert not attention_cost(attn, 4, "cuda", torch.bfloat16).setup.fused


def test_the_table_puts_truncated_alibi_beside_the_kernel_at_equal_cost():
    """``tools/kernel_tiles_table.py``: truncated ALiBi's windows at s samples' cost visit about
    the tiles of PLSH's band on the same kernel (within 10% at 8k, s = 8)."""
    from plsh_dist.ops.alibi import equal_cost_c, truncation_windows
    from plsh_dist.plan.kernel_tiles import window_tiles
    from tests.launchers import load_launcher

    table = load_launcher("kernel_tiles_table")
    rows = table.measure([8192], [8])
    per_head = next(r for r in rows if r["sigma"] == "per-head")
    sigma = table.sigmas()["per-head"]
    want = window_tiles(sigma, truncation_windows(equal_cost_c(8), sigma), 8192, table.HEADS, head_dim=128)
    assert per_head["truncated_eq"] == want.flash_equivalent
    for r in rows:
        assert 0.9 < r["kernel_eq"] / r["truncated_eq"] < 1.1
    assert "| truncated eq | kernel eq / truncated eq |" in table.markdown(rows, "cmd")
