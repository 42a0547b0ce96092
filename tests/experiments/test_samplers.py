"""The experimental samplers (experiments/samplers.py): registered on import, named by configs,
unbiased, exactly the draws they had inside plsh_dist.hashing.

The same statistic on deliberately biased variants must exceed the threshold,
so the unbiasedness tests can fail (statistics in tests/sampler_stats.py).
"""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from experiments.samplers import RAMP_GROUPS, ramp_draws, ramp_sizes
from plsh_dist.hashing import PositionalLSH, alibi_slopes, gamma2_ppf
from tests.sampler_stats import SIGMA, Z_MAX, gamma2_cdf, ks_distance, row0_z, z_scores
from tests.train.launcher_runs import ROOT, launcher_env


def _edges(s: int) -> tuple[np.ndarray, np.ndarray]:
    sizes = ramp_sizes(s, max(1, round(RAMP_GROUPS * math.sqrt(s))))
    return sizes, np.concatenate([[0], np.cumsum(sizes)]) / s


class _MidpointRamp(PositionalLSH):
    """A plausible bug: every pitch quantile at its stratum's midpoint (no jitter)."""

    def _unit_draws(self, t, h):
        gamma, unit = super()._unit_draws(t, h)
        sizes, edges = _edges(self.num_samples)
        g = np.clip(np.searchsorted(edges, gamma2_cdf(gamma), side="right") - 1, 0, sizes.size - 1)
        return gamma2_ppf((edges[g] + edges[g + 1]) / 2), unit


class _SameJitterRampAlt(PositionalLSH):
    """Another plausible bug: the alternation lost, but the jitter reused as a *fraction of the
    whole range* (q = v for every group): no longer stratified, and biased toward one pitch."""

    def _unit_draws(self, t, h):
        gamma, unit = super()._unit_draws(t, h)
        q = np.broadcast_to(np.sort(gamma2_cdf(gamma), axis=0)[:1], gamma.shape)
        return gamma2_ppf(q), unit


# Fingerprints of (pitch, shift) as drawn by plsh_dist.hashing before the samplers moved here:
# the move, and any later change, must keep every trained run's masks.
_FINGERPRINTS = {
    ("stratified_ramp", 256.0, 20, 0): "0308bd675167935d",
    ("stratified_ramp", "heads12", 100, 12345): "22764fab887cc499",
    ("stratified_ramp_alt", 256.0, 20, 0): "23a14da5766bd965",
    ("stratified_ramp_alt", "heads12", 100, 12345): "ea2507612ec68ff6",
}


@pytest.mark.parametrize("key", list(_FINGERPRINTS))
def test_draws_are_unchanged(key):
    sampler, sigma, s, seed = key
    sig = alibi_slopes(int(sigma[5:])).reciprocal() if isinstance(sigma, str) else sigma
    lsh = PositionalLSH(sig, s, seed, sampler)
    digest = hashlib.sha256(lsh.pitch.numpy().tobytes() + lsh.shift.numpy().tobytes()).hexdigest()[:16]
    assert digest == _FINGERPRINTS[key]


def test_importing_the_lab_registers_its_samplers():
    """plsh_dist alone knows its own two; importing ``experiments`` adds the lab's."""
    code = ("from plsh_dist.hashing import sampler_names; alone = sampler_names(); import experiments; "
            "print(alone, sampler_names())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == ["('iid',", "'stratified')", "('iid',", "'stratified',", "'stratified_ramp',",
                           "'stratified_ramp_alt')"]


def test_a_launcher_reads_a_config_naming_a_lab_sampler_and_its_module():
    """``launchers/plan.py`` (a config read, no training) with the repository root on PYTHONPATH, as the
    Makefile and experiments/replicate.py run the launchers: the path alone registers nothing, the
    setting ``[attention].sampler_module`` does."""
    def plan(*overrides):
        return subprocess.run([sys.executable, str(ROOT / "launchers" / "plan.py"), "--config",
                               str(ROOT / "configs" / "debug.toml"), "--device", "cpu", "--world-size", "1",
                               "--attention.sampler=stratified_ramp", *overrides], capture_output=True, text=True,
                              cwd=ROOT, env=launcher_env(), timeout=120)

    done = plan("--attention.sampler_module=experiments.samplers")
    assert done.returncode == 0, done.stderr
    refused = plan()
    assert refused.returncode == 2, refused.stderr
    assert "got 'stratified_ramp'" in refused.stderr and "[attention].sampler_module" in refused.stderr


@pytest.mark.parametrize("s", [16, 7])  # 7: two groups (2, 5), one antithetic pair
def test_stratified_ramp_is_unbiased(s):
    z = z_scores(PositionalLSH, "stratified_ramp", s, runs=400)
    assert float(z.max()) < Z_MAX


# 12, 16: three groups (v, 1 - v, v); 7: two groups, where alternating is the mirror pair.
# (Even four groups, s = 22 or 30, are left out: there the 5-SE statistic's tail at d ~ 7 sigma,
# L* ~ 1e-3, exceeds 5 for "stratified_ramp" as well, with seeds 0..399.)
@pytest.mark.parametrize("s", [16, 12, 7])
def test_stratified_ramp_alt_is_unbiased(s):
    z = z_scores(PositionalLSH, "stratified_ramp_alt", s, runs=400)
    assert float(z.max()) < Z_MAX


@pytest.mark.parametrize("cls,sampler", [(_MidpointRamp, "stratified_ramp"), (_MidpointRamp, "stratified_ramp_alt"),
                                         (_SameJitterRampAlt, "stratified_ramp_alt")])
def test_biased_ramp_sampler_is_caught(cls, sampler):
    z = z_scores(cls, sampler, 16, runs=400)
    assert float(z.max()) > Z_MAX


def test_ramp_sizes():
    assert ramp_sizes(16, 3).tolist() == [3, 5, 8]
    for s in range(1, 130):
        sizes = ramp_sizes(s, max(1, round(RAMP_GROUPS * math.sqrt(s))))
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
    for vals, cdf in ((torch.cat(pitch).numpy(), gamma2_cdf), (torch.cat(unit).numpy(), lambda x: x),
                      (np.asarray(first), gamma2_cdf)):
        dist, crit = ks_distance(vals, cdf)
        assert dist < crit


def test_ramp_per_head_independent_and_deterministic():
    sig = torch.tensor([4.0, 4.0])
    a = PositionalLSH(sig, 16, 3, "stratified_ramp")
    b = PositionalLSH(sig, 16, 3, "stratified_ramp")
    assert torch.equal(a.pitch, b.pitch) and torch.equal(a.shift, b.shift)
    assert not torch.equal(a.pitch[:, 0], a.pitch[:, 1])  # heads draw their own groups


def test_stratified_ramp_alt_collision_probability_per_distance():
    """Pooled over many seeds, row 0 of M~ follows exp(-d / sigma) (the same check as iid's)."""
    assert row0_z(lambda seed: PositionalLSH(SIGMA, 25, 1000 + seed, "stratified_ramp_alt"), range(200)) < Z_MAX


def test_stratified_ramp_alt_structure_deterministic_and_per_head():
    """Same (seed, sample, head) -> same draws; neighbouring groups' quantiles sit at v and 1 - v
    of their strata; heads draw their own jitter; the ramp's own draws are untouched by it."""
    sig = torch.tensor([4.0, 4.0])
    a = PositionalLSH(sig, 16, 3, "stratified_ramp_alt")
    b = PositionalLSH(sig, 16, 3, "stratified_ramp_alt")
    assert torch.equal(a.pitch, b.pitch) and torch.equal(a.shift, b.shift)
    assert not torch.equal(a.pitch[:, 0], a.pitch[:, 1])
    ramp = PositionalLSH(sig, 16, 3, "stratified_ramp")
    assert not torch.equal(a.pitch, ramp.pitch)
    _, edges = _edges(16)  # sizes [3, 5, 8]
    for head in range(2):
        q = np.unique(np.round(gamma2_cdf(a.pitch[:, head].numpy() / 4.0), 12))
        assert q.size == 3
        v = (q - edges[:-1]) / np.diff(edges)  # position inside each stratum
        assert np.allclose(v[0], v[2]) and np.allclose(v[1], 1.0 - v[0])
    with pytest.raises(ValueError, match="jitter"):
        ramp_draws(ramp, *np.meshgrid(np.arange(4), np.arange(1), indexing="ij"), jitter="bad")
