"""Truncated ALiBi at positional LSH's cost: the window rule against the band the hash really attends."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.approximation.equal_cost import band_keys, equal_cost_window, iid_band_keys, window_keys
from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.alibi import equal_cost_c

GRID_SIGMA = (4.0, 16.0, 64.0, 256.0)
GRID_S = (4, 8, 20, 100)


def test_window_rule():
    assert equal_cost_c(8) == pytest.approx(math.log(8) + 0.58)
    assert equal_cost_window(16.0, 8).tolist() == [math.ceil((math.log(8) + 0.58) * 16)]  # 43
    sigma = torch.tensor([4.0, 16.0, 64.0, 256.0])
    assert equal_cost_window(sigma, 20).tolist() == [math.ceil(equal_cost_c(20) * x) for x in sigma.tolist()]
    assert window_keys(43) == 43 and window_keys(43, causal=False) == 85
    with pytest.raises(ValueError, match="num_samples"):
        equal_cost_c(0)


@pytest.mark.parametrize("causal", [True, False])
def test_band_keys_equals_bucket_scan(causal):
    """The band from block bounds equals a scan of the buckets: the keys j whose bucket equals
    i's in at least one sample (j <= i when causal)."""
    sigma, s, n, pad = torch.tensor([3.0, 9.0]), 7, 120, 200
    hash_ = PositionalLSH(sigma, s, seed=4)
    positions = torch.arange(n)
    # Buckets of [-pad, n + pad): blocks of the queries reach at most a pitch beyond them.
    assert float(hash_.pitch.max()) < pad
    around = torch.arange(-pad, n + pad)
    b = hash_.buckets(around)  # (s, H, n + 2 pad)
    shared = (b[:, :, pad : pad + n, None] == b[:, :, None, :]).any(dim=0)  # (H, n, n + 2 pad)
    if causal:
        shared &= around[None, None, :] <= positions[None, :, None]
    want = shared.sum(dim=-1).to(torch.float64)
    assert torch.equal(band_keys(hash_, positions, causal=causal), want)


def test_iid_band_formula():
    """The exact expectation against its continuous limit sigma * H_s + 1/2 (the integer
    positions add a half key: Euler-Maclaurin), and against a brute-force sum."""
    for sigma in GRID_SIGMA:
        for s in GRID_S:
            harmonic = sum(1.0 / k for k in range(1, s + 1))
            assert iid_band_keys(sigma, s) == pytest.approx(sigma * harmonic + 0.5, abs=0.05)
    brute = 1.0 + sum(1.0 - (1.0 - math.exp(-d / 5.0)) ** 8 for d in range(1, 2000))
    assert iid_band_keys(5.0, 8) == pytest.approx(brute, rel=1e-12)
    assert iid_band_keys(5.0, 8, causal=False) == pytest.approx(2 * brute - 1, rel=1e-12)


@pytest.mark.parametrize("sigma,s", [(4.0, 4), (4.0, 20), (16.0, 8)])
def test_measured_iid_band_matches_expectation(sigma, s):
    """The hash's band has the expected mean.  A seed fixes s pitches for every position, so
    one hash's mean band scatters widely (37% at sigma = 4, s = 4); i.i.d. samples are
    independent across the sample index, so one hash of ``s * groups`` samples holds
    ``groups`` independent s-sample hashes.  4000 of them put the mean within about 0.6%
    (one standard error); the test allows 4 standard errors."""
    groups = 4000
    positions = torch.arange(0, 64 * int(sigma), int(sigma))
    starts, _ = PositionalLSH(sigma, s * groups, seed=0).block_bounds(positions, 0, ends=False)  # (s groups, m)
    keys = (positions + 1 - starts.view(groups, s, -1).min(dim=1).values).to(torch.float64).mean(dim=1)
    stderr = float(keys.std()) / math.sqrt(groups)
    assert abs(float(keys.mean()) - iid_band_keys(sigma, s)) < 4 * stderr
    assert stderr < 0.01 * iid_band_keys(sigma, s)  # the check above is a tight one


def test_equal_cost_window_matches_the_band():
    """Over the study's grid the window ``ceil((ln s + 0.58) sigma)`` is close to the i.i.d.
    band it stands for (causal keys, the query included), and never more than 1% above it (so
    the comparison does not favour truncation).  ``0.58`` is the large-s limit of
    ``H_s - ln s``; the band also holds half a key more than ``sigma H_s`` (integer positions).
    Measured: 5.4-9.4% short at s = 4 (``H_4 - ln 4 = 0.70``; 9.4% at sigma = 4, where the
    half key counts), 2-3.3% short at s = 8, -1.2% to +0.7% from s = 20 on."""
    for sigma in GRID_SIGMA:
        for s in GRID_S:
            w = int(equal_cost_window(sigma, s))
            band = iid_band_keys(sigma, s)
            rel = (window_keys(w) - band) / band
            assert -(0.10 if s < 8 else 0.035 if s < 20 else 0.015) < rel < 0.01, (sigma, s, w, band)
