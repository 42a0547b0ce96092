"""Samplers of PositionalLSH: exact collision law (unbiasedness) and variance.

The collision law ``P[bucket(i) == bucket(j)] = exp(-|i - j| / sigma)`` is
checked empirically: the mean of M~ over many independent seeds is compared
with L* entry by entry, in units of its standard error.  The same statistic
on a deliberately biased sampler must exceed the threshold, so the test can
fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from plsh_dist.eval.approx_error import RunningMask, mask_error
from plsh_dist.hashing import PositionalLSH, _gamma2_ppf
from plsh_dist.ops.reference import alibi_weights

N = 48  # positions: enough distances (up to 12 sigma) for a small, fast test
SIGMA = 4.0
# 5 standard errors: over the ~1.1k upper-triangle entries a two-sided 5-SE
# excursion of an unbiased estimator has probability ~6e-4 in total; seeds are
# fixed, so the test is deterministic either way.
Z_MAX = 5.0


def _gamma2_cdf(x: np.ndarray) -> np.ndarray:
    """CDF of Gamma(2, 1) without cancellation: e^{-x} * sum_{k>=2} x^k / k!."""
    x = np.asarray(x, dtype=np.float64)
    small = x < 1.0
    term, series = x * x / 2.0, np.zeros_like(x)
    for k in range(3, 40):
        series, term = series + term, term * x / k
    return np.where(small, np.exp(-x) * series, -np.expm1(-x) - x * np.exp(-x))


def _z_scores(cls, sampler: str, s: int, runs: int, seed0: int = 0) -> torch.Tensor:
    """|mean(M~) - L*| / standard error, per upper-triangle entry, over ``runs`` seeds."""
    total = torch.zeros(N, N, dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for r in range(runs):
        m = cls(SIGMA, s, seed0 + r, sampler).averaged_mask(torch.arange(N))[0]
        total += m
        total_sq += m * m
    mean = total / runs
    var = (total_sq / runs - mean * mean).clamp_min(0) * runs / (runs - 1)
    # Floor: one collision among all runs * s draws, the estimator's resolution
    # (entries far off the diagonal are 0 in every run and L* ~ e^-12 there).
    se = (var / runs).sqrt().clamp_min(1.0 / (runs * s))
    target = alibi_weights(torch.tensor([1.0 / SIGMA], dtype=torch.float64), torch.arange(N))[0]
    iu = torch.triu_indices(N, N, offset=1)
    return ((mean - target).abs() / se)[iu[0], iu[1]]


class _MidpointStratified(PositionalLSH):
    """A plausible bug: every group's pitch quantile at its stratum's midpoint (no jitter)."""

    def _stratified_unit_draws(self, t, h):
        gamma, unit = super()._stratified_unit_draws(t, h)
        groups = max(1, round(math.sqrt(self.num_samples)))
        q = _gamma2_cdf(gamma)
        return _gamma2_ppf((np.floor(q * groups) + 0.5) / groups), unit


@pytest.mark.parametrize("s", [16, 7])  # 7: uneven groups (3, 2, 2)
def test_stratified_is_unbiased(s):
    z = _z_scores(PositionalLSH, "stratified", s, runs=400)
    assert float(z.max()) < Z_MAX


def test_iid_collision_law():
    z = _z_scores(PositionalLSH, "iid", 16, runs=400)
    assert float(z.max()) < Z_MAX


def test_biased_sampler_is_caught():
    z = _z_scores(_MidpointStratified, "stratified", 16, runs=400)
    assert float(z.max()) > Z_MAX


def test_collision_probability_per_distance():
    """Pooled over many draws, P[collide at distance d] = exp(-d / sigma) for both samplers."""
    d = torch.arange(N, dtype=torch.float64)
    for sampler in ("iid", "stratified"):
        run = RunningMask(1, N)
        for seed in range(200):
            run.add(PositionalLSH(SIGMA, 25, 1000 + seed, sampler).buckets(torch.arange(N)))
        m = run.mean()[0]
        # Row 0 only: entries of one row at different d come from the same draws.
        got = m[0]
        want = torch.exp(-d / SIGMA)
        se = (want * (1 - want) / run.count).sqrt().clamp_min(1.0 / run.count)
        assert float(((got - want).abs() / se).max()) < Z_MAX, sampler


def test_gamma2_ppf_inverts_cdf():
    q = np.unique(np.concatenate([np.logspace(-15, -1, 50), np.linspace(0.01, 0.99, 99), 1 - np.logspace(-12, -1, 40)]))
    x = _gamma2_ppf(q)
    # float64 round trip: the CDF series is accurate to a few ulps.
    np.testing.assert_allclose(_gamma2_cdf(x), q, rtol=1e-11)
    upper = q > 0.5
    # Upper tail in survival terms (1 - q is known to ~1e-16 absolute only).
    np.testing.assert_allclose((1 + x[upper]) * np.exp(-x[upper]), 1 - q[upper], rtol=1e-3, atol=1e-15)
    assert np.all(np.diff(x) >= 0)  # non-decreasing (two q values differ by one ulp)


def test_stratified_marginals_are_gamma_uniform():
    """Pitch / sigma ~ Gamma(2, 1) and shift / pitch ~ U(0, 1) across seeds (KS distance)."""
    pitch, unit = [], []
    for seed in range(300):
        hsh = PositionalLSH(SIGMA, 16, seed, "stratified")
        pitch.append(hsh.pitch[:, 0] / SIGMA)
        unit.append(hsh.shift[:, 0] / hsh.pitch[:, 0])
    p = np.sort(torch.cat(pitch).numpy())
    u = np.sort(torch.cat(unit).numpy())
    ecdf = np.arange(1, p.size + 1) / p.size
    # KS critical value at alpha = 1e-3 is 1.95 / sqrt(m); draws within one
    # seed are negatively correlated (stratified), which only shrinks the distance.
    crit = 1.95 / math.sqrt(p.size)
    assert np.abs(_gamma2_cdf(p) - ecdf).max() < crit
    assert np.abs(u - ecdf).max() < crit


def test_stratified_needs_at_most_a_quarter_of_the_samples():
    """The issue's target at s = 64: stratified s = 16 reaches iid s = 64's max-norm error.

    Small n and few seeds to keep it fast: the measured ratio at n = 1024 is
    in the launcher's report.  Margin 10%: stratified s = 16 measures about
    0.9x iid s = 64 here, and 6 seeds leave ~5% noise on each mean.
    """
    iid = mask_error(8.0, 256, [64], 6, "iid", spectral=False)[0]["max_mean"]
    strat = mask_error(8.0, 256, [16], 6, "stratified", spectral=False)[0]["max_mean"]
    assert strat < 1.10 * iid


# -- "stratified_ramp": fewer, ramped groups with antithetic pitch jitter --------


class _MidpointRamp(PositionalLSH):
    """The same plausible bug for the ramp sampler: every pitch quantile at its stratum's midpoint."""

    def _ramp_unit_draws(self, t, h):
        from plsh_dist.hashing import _ramp_sizes

        gamma, unit = super()._ramp_unit_draws(t, h)
        s = self.num_samples
        sizes = _ramp_sizes(s, max(1, round(0.75 * math.sqrt(s))))
        edges = np.concatenate([[0], np.cumsum(sizes)]) / s
        q = _gamma2_cdf(gamma)
        g = np.clip(np.searchsorted(edges, q, side="right") - 1, 0, sizes.size - 1)
        return _gamma2_ppf((edges[g] + edges[g + 1]) / 2), unit


@pytest.mark.parametrize("s", [16, 7])  # 7: two groups (2, 5), one antithetic pair
def test_stratified_ramp_is_unbiased(s):
    z = _z_scores(PositionalLSH, "stratified_ramp", s, runs=400)
    assert float(z.max()) < Z_MAX


def test_biased_ramp_sampler_is_caught():
    z = _z_scores(_MidpointRamp, "stratified_ramp", 16, runs=400)
    assert float(z.max()) > Z_MAX


def test_ramp_sizes():
    from plsh_dist.hashing import _ramp_sizes

    assert _ramp_sizes(16, 3).tolist() == [3, 5, 8]
    for s in range(1, 130):
        g = max(1, round(0.75 * math.sqrt(s)))
        sizes = _ramp_sizes(s, g)
        assert sizes.sum() == s and sizes.min() >= 1 and np.all(np.diff(sizes) >= 0), s


@pytest.mark.parametrize("sampler", ["stratified_ramp", "stratified_ramp_alt"])
def test_stratified_ramp_marginals_are_gamma_uniform(sampler):
    """Each sample index's own pitch / sigma ~ Gamma(2, 1) (random slot), and shift / pitch ~ U(0, 1)."""
    pitch, unit, first = [], [], []
    for seed in range(300):
        hsh = PositionalLSH(SIGMA, 16, seed, sampler)
        pitch.append(hsh.pitch[:, 0] / SIGMA)
        unit.append(hsh.shift[:, 0] / hsh.pitch[:, 0])
        first.append(float(hsh.pitch[0, 0] / SIGMA))
    for vals, cdf in ((torch.cat(pitch).numpy(), _gamma2_cdf), (torch.cat(unit).numpy(), lambda x: x),
                      (np.asarray(first), _gamma2_cdf)):
        v = np.sort(vals)
        ecdf = np.arange(1, v.size + 1) / v.size
        assert np.abs(cdf(v) - ecdf).max() < 1.95 / math.sqrt(v.size)


def test_ramp_per_head_independent_and_deterministic():
    sig = torch.tensor([4.0, 4.0])
    a = PositionalLSH(sig, 16, 3, "stratified_ramp")
    b = PositionalLSH(sig, 16, 3, "stratified_ramp")
    assert torch.equal(a.pitch, b.pitch) and torch.equal(a.shift, b.shift)
    assert not torch.equal(a.pitch[:, 0], a.pitch[:, 1])  # heads draw their own groups


# -- "stratified_ramp_alt": the ramp with one alternating antithetic jitter ------------


class _MidpointRampAlt(PositionalLSH):
    """The plausible bug for the alternating jitter: every pitch quantile at its stratum's midpoint."""

    def _ramp_unit_draws(self, t, h, jitter="mirror"):
        from plsh_dist.hashing import _ramp_sizes

        gamma, unit = super()._ramp_unit_draws(t, h, jitter)
        s = self.num_samples
        sizes = _ramp_sizes(s, max(1, round(0.75 * math.sqrt(s))))
        edges = np.concatenate([[0], np.cumsum(sizes)]) / s
        g = np.clip(np.searchsorted(edges, _gamma2_cdf(gamma), side="right") - 1, 0, sizes.size - 1)
        return _gamma2_ppf((edges[g] + edges[g + 1]) / 2), unit


class _SameJitterRampAlt(PositionalLSH):
    """Another plausible bug: the alternation lost, but the jitter reused as a *fraction of the
    whole range* (q = v for every group): no longer stratified, and biased toward one pitch."""

    def _ramp_unit_draws(self, t, h, jitter="mirror"):
        gamma, unit = super()._ramp_unit_draws(t, h, jitter)
        q = np.broadcast_to(np.sort(_gamma2_cdf(gamma), axis=0)[:1], gamma.shape)
        return _gamma2_ppf(q), unit


# 12, 16: three groups (v, 1 - v, v); 7: two groups, where alternating is the mirror pair.
# (Even four groups, s = 22 or 30, are left out: there the 5-SE statistic's tail at d ~ 7 sigma,
# L* ~ 1e-3, exceeds 5 for "stratified_ramp" as well, with seeds 0..399.)
@pytest.mark.parametrize("s", [16, 12, 7])
def test_stratified_ramp_alt_is_unbiased(s):
    z = _z_scores(PositionalLSH, "stratified_ramp_alt", s, runs=400)
    assert float(z.max()) < Z_MAX


@pytest.mark.parametrize("cls", [_MidpointRampAlt, _SameJitterRampAlt])
def test_biased_ramp_alt_sampler_is_caught(cls):
    z = _z_scores(cls, "stratified_ramp_alt", 16, runs=400)
    assert float(z.max()) > Z_MAX


def test_stratified_ramp_alt_collision_probability_per_distance():
    """Pooled over many seeds, row 0 of M~ follows exp(-d / sigma) (the same check as iid's)."""
    d = torch.arange(N, dtype=torch.float64)
    run = RunningMask(1, N)
    for seed in range(200):
        run.add(PositionalLSH(SIGMA, 25, 1000 + seed, "stratified_ramp_alt").buckets(torch.arange(N)))
    want = torch.exp(-d / SIGMA)
    se = (want * (1 - want) / run.count).sqrt().clamp_min(1.0 / run.count)
    assert float(((run.mean()[0][0] - want).abs() / se).max()) < Z_MAX


def test_stratified_ramp_alt_structure_deterministic_and_per_head():
    """Same (seed, sample, head) -> same draws; neighbouring groups' quantiles sit at v and 1 - v
    of their strata; heads draw their own jitter; the ramp's own draws are untouched by it."""
    from plsh_dist.hashing import _ramp_sizes

    sig = torch.tensor([4.0, 4.0])
    a = PositionalLSH(sig, 16, 3, "stratified_ramp_alt")
    b = PositionalLSH(sig, 16, 3, "stratified_ramp_alt")
    assert torch.equal(a.pitch, b.pitch) and torch.equal(a.shift, b.shift)
    assert not torch.equal(a.pitch[:, 0], a.pitch[:, 1])
    ramp = PositionalLSH(sig, 16, 3, "stratified_ramp")
    assert not torch.equal(a.pitch, ramp.pitch)
    sizes = _ramp_sizes(16, 3)  # [3, 5, 8]
    edges = np.concatenate([[0], np.cumsum(sizes)]) / 16
    for head in range(2):
        q = np.unique(np.round(_gamma2_cdf(a.pitch[:, head].numpy() / 4.0), 12))
        assert q.size == 3
        v = (q - edges[:-1]) / np.diff(edges)  # position inside each stratum
        assert np.allclose(v[0], v[2]) and np.allclose(v[1], 1.0 - v[0])
    with pytest.raises(ValueError, match="jitter"):
        ramp._ramp_unit_draws(*np.meshgrid(np.arange(4), np.arange(1), indexing="ij"), jitter="bad")
