"""Statistics shared by the sampler tests (tests/test_stratified_sampler.py, tests/experiments/).

The collision law ``P[bucket(i) == bucket(j)] = exp(-|i - j| / sigma)`` is
checked empirically: the mean of M~ over many independent seeds is compared
with L* entry by entry, in units of its standard error.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from experiments.approximation.approx_error import RunningMask
from plsh_dist.ops.reference import alibi_weights

N = 48  # positions: enough distances (up to 12 sigma) for a small, fast test
SIGMA = 4.0
# 5 standard errors: over the ~1.1k upper-triangle entries a two-sided 5-SE
# excursion of an unbiased estimator has probability ~6e-4 in total; seeds are
# fixed, so the test is deterministic either way.
Z_MAX = 5.0


def gamma2_cdf(x: np.ndarray) -> np.ndarray:
    """CDF of Gamma(2, 1) without cancellation: e^{-x} * sum_{k>=2} x^k / k!."""
    x = np.asarray(x, dtype=np.float64)
    small = x < 1.0
    term, series = x * x / 2.0, np.zeros_like(x)
    for k in range(3, 40):
        series, term = series + term, term * x / k
    return np.where(small, np.exp(-x) * series, -np.expm1(-x) - x * np.exp(-x))


def z_scores(cls, sampler: str, s: int, runs: int, seed0: int = 0) -> torch.Tensor:
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


def row0_z(lsh_of_seed, seeds: range) -> float:
    """Max |P[collide at distance d] - exp(-d / sigma)| / SE over row 0 of M~, pooled over ``seeds``
    (row 0 only: entries of one row at different d come from the same draws)."""
    d = torch.arange(N, dtype=torch.float64)
    run = RunningMask(1, N)
    for seed in seeds:
        run.add(lsh_of_seed(seed).buckets(torch.arange(N)))
    want = torch.exp(-d / SIGMA)
    se = (want * (1 - want) / run.count).sqrt().clamp_min(1.0 / run.count)
    return float(((run.mean()[0][0] - want).abs() / se).max())


def ks_distance(values: np.ndarray, cdf) -> tuple[float, float]:
    """(Kolmogorov-Smirnov distance of ``values`` to ``cdf``, its critical value at alpha = 1e-3)."""
    v = np.sort(values)
    ecdf = np.arange(1, v.size + 1) / v.size
    return float(np.abs(cdf(v) - ecdf).max()), 1.95 / math.sqrt(v.size)
