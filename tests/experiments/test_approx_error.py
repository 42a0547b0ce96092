"""Approximation-error tools: fast M~ equals the dense one, norms, rates, bound."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.approximation.approx_error import (
    _CachedAttention,
    averaged_masks,
    fit_loglog_slope,
    mask_error,
    max_block_size,
    output_error,
    paper_bound,
    psi_sigma,
    samples_to_match,
    symmetric_spectral_norm,
    truncated_mask_error,
    truncated_output_error,
    truncated_weights,
)
from experiments.approximation.equal_cost import equal_cost_window
from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.reference import alibi_weights, dense_attention


@pytest.mark.parametrize("sampler", ["iid", "stratified"])
def test_running_mask_equals_dense_average(sampler):
    sigma = torch.tensor([3.0, 11.0])
    n = 150
    for s, fast in averaged_masks(sigma, n, [1, 2, 5, 16], seed=7, sampler=sampler):
        dense = PositionalLSH(sigma, s, 7, sampler).averaged_mask(torch.arange(n))
        # count / s against a mean of s ones and zeros: equal up to rounding.
        torch.testing.assert_close(fast, dense, rtol=0, atol=1e-15)


def test_spectral_norm_matches_matrix_norm():
    torch.manual_seed(0)
    a = torch.randn(200, 200, dtype=torch.float64)
    mats = [a + a.T]
    for s, m in averaged_masks(6.0, 300, [3, 40], seed=1):
        mats.append((alibi_weights(torch.tensor([1 / 6.0], dtype=torch.float64), torch.arange(300)) - m)[0])
    for mat in mats:
        want = float(torch.linalg.matrix_norm(mat, ord=2))
        # Lanczos stops at 1e-12 relative change; 1e-9 leaves room for a slow tail.
        assert symmetric_spectral_norm(mat) == pytest.approx(want, rel=1e-9)


def test_cached_attention_equals_dense_attention():
    torch.manual_seed(0)
    q = torch.randn(2, 33, 4, 8)
    k, v = torch.randn(2, 33, 2, 8), torch.randn(2, 33, 2, 8)
    w = PositionalLSH(torch.tensor([2.0, 4.0, 8.0, 16.0]), 5, 0).averaged_mask(torch.arange(33))
    for causal in (True, False):
        got = _CachedAttention(q, k, v, causal, None)(w)
        # fp64 both ways; only the masking (-inf vs zero weight) differs.
        torch.testing.assert_close(got, dense_attention(q, k, v, w, causal=causal), rtol=1e-12, atol=1e-12)


def test_psi_and_bound():
    for sigma in (0.5, 4.0, 300.0):
        x = 1 / sigma
        assert psi_sigma(sigma) == pytest.approx(1 + sigma + (math.exp(x) + 1) / (math.exp(x) - 1), rel=1e-12)
    assert paper_bound(16.0, 1024, 4) == pytest.approx(psi_sigma(16.0) * (math.sqrt(math.log(1024) / 4) + math.log(1024) / 4))
    with pytest.raises(ValueError, match="sigma"):
        psi_sigma(0.0)


def test_iid_rate_and_paper_bound():
    """Max-norm error of i.i.d. sampling falls like s^-1/2; the paper's bound holds at every point.

    Choices, and why the slope is robust: s from 16 up (below, the max norm
    saturates near 1, an entry with L* ~ 0.9 missed by every sample), n = 256
    and sigma = 8 (many (i, j) pairs at every collision probability), 12 seeds
    averaged.  Over five disjoint 8-seed sets the slope measured -0.48 to -0.54,
    so [-0.6, -0.4] is about 4 standard deviations from either edge.
    """
    samples = [16, 32, 64, 128, 256, 512, 1024]
    recs = mask_error(8.0, 256, samples, 12, "iid", spectral=True)
    slope = fit_loglog_slope(samples, [r["max_mean"] for r in recs])
    assert -0.6 <= slope <= -0.4
    for r in recs:
        assert max(r["spectral_values"]) <= r["bound"]
        assert max(r["max_values"]) <= r["bound"]
        # |a_ij| <= ||a||_2 for any matrix: a check on the two norms' plumbing.
        assert all(m <= sp + 1e-12 for m, sp in zip(r["max_values"], r["spectral_values"]))


def test_stratified_beats_iid_at_equal_samples():
    it = mask_error(8.0, 256, [64], 4, "iid", spectral=False)[0]["max_mean"]
    st = mask_error(8.0, 256, [64], 4, "stratified", spectral=False)[0]["max_mean"]
    assert st < 0.7 * it  # measured ~0.45x; 0.7 leaves room for 4-seed noise


def test_output_error_shrinks_with_samples():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 96, 2, 8), torch.randn(1, 96, 2, 8), torch.randn(1, 96, 2, 8)
    recs = output_error(q, k, v, 6.0, [1, 16, 256], 3)
    rel = [r["rel_fro_mean"] for r in recs]
    assert rel[0] > rel[1] > rel[2]
    assert rel[2] < 0.1
    # Exactly dense attention with M~ as the weights, checked for one seed.
    (rec,) = output_error(q, k, v, 6.0, [16], [5])
    exact = dense_attention(q, k, v, alibi_weights(torch.tensor([1 / 6.0], dtype=torch.float64), torch.arange(96)))
    approx = dense_attention(q, k, v, PositionalLSH(6.0, 16, 5).averaged_mask(torch.arange(96)))
    assert rec["rel_fro_mean"] == pytest.approx(float((exact - approx).norm() / exact.norm()), rel=1e-10)
    assert rec["rel_fro_batch_mean"] == [pytest.approx(rec["rel_fro_mean"], rel=1e-12)]  # B = 1
    with pytest.raises(ValueError, match="one per query head"):
        output_error(q, k, v, torch.tensor([1.0, 2.0, 3.0]), [1], 1)


def test_max_block_size():
    one = max_block_size(16.0, 4096, 4, num_samples=1)
    many = max_block_size(16.0, 4096, 4, num_samples=64)
    assert many["largest_mean"] > one["largest_mean"] > one["mean_block"] > 0
    # A block is a run of integer positions inside one pitch: at most ceil(pitch) long.
    for seed in range(4):
        pitch = PositionalLSH(16.0, 64, seed).pitch.max()
        assert many["largest_values"][seed] <= math.ceil(float(pitch))
    assert one["sigma_loglogn"] == pytest.approx(16.0 * math.log(math.log(4096)))


def test_curve_helpers():
    s = [1, 2, 4, 8, 16]
    recs = [{"s": x, "max_mean": 0.8 * x**-0.5} for x in s]
    assert fit_loglog_slope(s, [r["max_mean"] for r in recs]) == pytest.approx(-0.5)
    assert samples_to_match(recs, 0.8 * 5**-0.5) == pytest.approx(5.0)
    assert samples_to_match(recs, 0.01) is None
    with pytest.raises(ValueError, match="increasing"):
        mask_error(4.0, 32, [4, 2], 1)


def test_max_block_size_agrees_with_buckets():
    """The chunked bucket formula in max_block_size is PositionalLSH.buckets'."""
    n, s = 500, 150  # s > one chunk of 64 samples
    rec = max_block_size(5.0, n, [3], num_samples=s)
    b = PositionalLSH(5.0, s, 3).buckets(torch.arange(n))[:, 0]
    lengths = [torch.unique_consecutive(row, return_counts=True)[1] for row in b]
    assert rec["largest_values"] == [float(max(int(x.max()) for x in lengths))]
    assert rec["mean_block"] == pytest.approx(n * s / sum(x.numel() for x in lengths))


def test_truncated_weights_drop_exactly_the_far_entries():
    sigma = torch.tensor([2.0, 7.0])
    w = truncated_weights(sigma, 40, torch.tensor([3, 11]))
    full = alibi_weights(1.0 / sigma.double(), torch.arange(40))
    dist = (torch.arange(40)[:, None] - torch.arange(40)[None, :]).abs()
    for h, window in enumerate((3, 11)):
        assert torch.equal(w[h][dist < window], full[h][dist < window])
        assert bool((w[h][dist >= window] == 0).all())
    # The scalar-window path of the dense reference (sliding-window ALiBi) is the same matrix.
    assert torch.equal(truncated_weights(7.0, 40, torch.tensor([11]))[0],
                       alibi_weights(torch.tensor([1 / 7.0], dtype=torch.float64), torch.arange(40), window=11)[0])
    with pytest.raises(ValueError, match="one int >= 1 per head"):
        truncated_weights(sigma, 40, torch.tensor([3]))


def test_truncated_mask_error_is_the_largest_dropped_weight():
    """Max norm: ``exp(-w / sigma)``, the weight at distance w (analytic; equal to rounding).
    Spectral norm: Lanczos against a dense SVD."""
    n = 300
    for sigma in (4.0, 16.0):
        recs = truncated_mask_error(sigma, n, [4, 8, 20])
        for r in recs:
            w = int(equal_cost_window(sigma, r["s"]))
            assert r["window"] == w and r["sampler"] == "truncated"
            assert r["max_mean"] == pytest.approx(math.exp(-w / sigma), rel=1e-12) and r["max_std"] == 0
            # e^{-w / sigma} <= e^{-c} with c = ln s + 0.58: a weight below e^{-c} is what is dropped.
            assert r["max_mean"] <= math.exp(-(math.log(r["s"]) + 0.58)) * (1 + 1e-12)
            diff = alibi_weights(torch.tensor([1 / sigma], dtype=torch.float64), torch.arange(n))[0]
            diff = diff * ((torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() >= w)
            assert r["spectral_mean"] == pytest.approx(float(torch.linalg.matrix_norm(diff, ord=2)), rel=1e-9)
    (given,) = truncated_mask_error(4.0, n, [8], spectral=False, windows=[5])
    assert given["window"] == 5 and given["max_mean"] == pytest.approx(math.exp(-5 / 4.0), rel=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_truncated_output_error_against_brute_force(causal):
    """Per-head windows, grouped-query attention: the entry equals softmax attention with the
    ALiBi bias ``-|i - j| / sigma_h`` and ``-inf`` outside the window, computed as logits."""
    torch.manual_seed(1)
    B, T, Hq, Hkv, D = 2, 70, 4, 2, 8
    q, k, v = torch.randn(B, T, Hq, D), torch.randn(B, T, Hkv, D), torch.randn(B, T, Hkv, D)
    sigma = torch.tensor([1.5, 3.0, 6.0, 12.0])
    recs = truncated_output_error(q, k, v, sigma, [2, 8], causal=causal)
    pos = torch.arange(T)
    dist = (pos[:, None] - pos[None, :]).abs().to(torch.float64)
    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    k64, v64 = k64.repeat_interleave(Hq // Hkv, dim=2), v64.repeat_interleave(Hq // Hkv, dim=2)
    logits = torch.einsum("bihd,bjhd->bhij", q64, k64) * D**-0.5

    def attend(window):  # window: None (exact ALiBi) or LongTensor[Hq]
        bias = -dist[None] / sigma.double()[:, None, None]  # (Hq, T, T)
        if window is not None:
            bias = bias.masked_fill(dist[None] >= window[:, None, None], float("-inf"))
        if causal:
            bias = bias.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        probs = torch.softmax(logits + bias[None], dim=-1)
        return torch.einsum("bhij,bjhd->bihd", probs, v64)

    exact = attend(None)
    for r in recs:
        window = equal_cost_window(sigma, r["s"])
        assert r["window"] == window.tolist()
        err = exact - attend(window)
        assert r["rel_fro_mean"] == pytest.approx(float(err.norm() / exact.norm()), rel=1e-9)
        assert r["max_mean"] == pytest.approx(float(err.abs().max()), rel=1e-9)
        for b in range(B):  # each batch element alone
            want = float(err[b].norm() / exact[b].norm())
            assert r["rel_fro_batch_mean"][b] == pytest.approx(want, rel=1e-9) and r["rel_fro_batch_std"][b] == 0
    assert recs[0]["rel_fro_mean"] > recs[1]["rel_fro_mean"] > 0  # a wider window errs less
    # Windows given explicitly (one for every head): the same as the rule's where they agree.
    (given,) = truncated_output_error(q, k, v, 6.0, [8], causal=causal, windows=[int(equal_cost_window(6.0, 8))])
    (rule,) = truncated_output_error(q, k, v, 6.0, [8], causal=causal)
    assert given["rel_fro_mean"] == rule["rel_fro_mean"] and given["window"] == rule["window"]
    with pytest.raises(ValueError, match="one int >= 1 per s"):
        truncated_output_error(q, k, v, 6.0, [8], windows=[3, 4])
