"""Positional LSH hashing: collision law, contiguity, purity, fixed blocks, slopes."""

import math

import pytest
import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes, cu_seqlens_from_buckets


@pytest.mark.parametrize("sigma", [0.7, 3.0, 50.0, 256.0])
@pytest.mark.parametrize("base", [0, 10**6])
def test_collision_probability_is_laplacian_kernel(sigma, base):
    """P[bucket(i) = bucket(j)] = exp(-|i-j|/sigma) within 4 standard errors, 20k samples."""
    samples = 20_000
    lsh = PositionalLSH(sigma, samples, seed=1234 + base)
    dists = sorted({0, 1, 2, 5, int(sigma), int(3 * sigma) + 1})
    positions = torch.tensor([base] + [base + d for d in dists[1:]])
    b = lsh.buckets(positions)[:, 0, :]  # (s, n)
    for col, d in enumerate(dists):
        p = math.exp(-d / sigma)
        empirical = (b[:, 0] == b[:, col]).double().mean().item()
        stderr = math.sqrt(max(p * (1 - p), 1e-12) / samples)
        assert abs(empirical - p) <= 4 * stderr + 1e-12, (sigma, base, d, empirical, p)


def test_buckets_are_contiguous_runs_and_cu_seqlens_match():
    lsh = PositionalLSH(torch.tensor([0.7, 4.0, 60.0]), 5, seed=3)
    pos = torch.arange(500, 1500)
    b = lsh.buckets(pos)
    assert b.shape == (5, 3, 1000) and b.dtype == torch.int64
    assert bool((b[..., 1:] >= b[..., :-1]).all()), "buckets must be non-decreasing in position"
    for t in range(5):
        for h in range(3):
            cu = cu_seqlens_from_buckets(b[t, h])
            assert cu.dtype == torch.int32 and int(cu[0]) == 0 and int(cu[-1]) == 1000
            ids = torch.repeat_interleave(torch.arange(cu.numel() - 1), (cu[1:] - cu[:-1]).long())
            # each block is exactly one bucket, and different blocks are different buckets
            assert torch.unique_consecutive(b[t, h]).numel() == cu.numel() - 1
            assert bool((b[t, h] == b[t, h][cu[:-1].long()][ids]).all())
    assert lsh.cu_seqlens(pos)[2][1].tolist() == cu_seqlens_from_buckets(b[2, 1]).tolist()


def test_full_blocks_have_floor_or_ceil_pitch_length():
    lsh = PositionalLSH(torch.tensor([3.0, 40.0]), 4, seed=9)
    cu_all = lsh.cu_seqlens(torch.arange(3000))
    for t in range(4):
        for h in range(2):
            lengths = (cu_all[t][h][1:] - cu_all[t][h][:-1])[1:-1]  # interior blocks
            d = float(lsh.pitch[t, h])
            assert set(lengths.tolist()) <= {math.floor(d), math.ceil(d)}


@pytest.mark.parametrize("a,b", [(0, 1000), (137, 911), (10**6 + 3, 10**6 + 700), (2**40, 2**40 + 50)])
def test_sub_range_equals_slice_of_full_range(a, b):
    lsh = PositionalLSH(torch.tensor([0.9, 17.0, 256.0]), 6, seed=77)
    lo = min(a, 10**6 - 10) if a < 2**40 else a
    full = lsh.buckets(torch.arange(lo, b))
    part = lsh.buckets(torch.arange(a, b))
    assert torch.equal(full[..., a - lo :], part)


def test_same_seed_same_buckets_other_seed_other_buckets():
    pos = torch.arange(2000)
    b1 = PositionalLSH(8.0, 4, seed=5).buckets(pos)
    b2 = PositionalLSH(8.0, 4, seed=5).buckets(pos)
    b3 = PositionalLSH(8.0, 4, seed=6).buckets(pos)
    assert torch.equal(b1, b2)
    assert not torch.equal(b1, b3)


def test_sample_t_does_not_depend_on_num_samples():
    """A pure function of (seed, sample, head, position): asking for more samples keeps the first ones."""
    pos = torch.arange(300)
    few = PositionalLSH(torch.tensor([2.0, 9.0]), 3, seed=11).buckets(pos)
    many = PositionalLSH(torch.tensor([2.0, 9.0]), 10, seed=11).buckets(pos)
    assert torch.equal(few, many[:3])


def test_averaged_mask_is_mean_of_block_masks():
    lsh = PositionalLSH(torch.tensor([1.5, 6.0]), 3, seed=2)
    pos = torch.arange(40)
    m = lsh.averaged_mask(pos)
    b = lsh.buckets(pos)
    expected = torch.stack([(b[t][:, :, None] == b[t][:, None, :]).double() for t in range(3)]).mean(0)
    assert m.shape == (2, 40, 40) and m.dtype == torch.float64
    assert torch.equal(m, expected)
    assert torch.equal(torch.diagonal(m, dim1=1, dim2=2), torch.ones(2, 40, dtype=torch.float64))


def test_fixed_blocks_pitch_two_sigma_shift_zero():
    fb = FixedBlocks(torch.tensor([2.0, 5.0]))
    b = fb.buckets(torch.arange(30))
    assert b.shape == (1, 2, 30)
    assert torch.equal(b[0, 0], torch.arange(30) // 4)
    assert torch.equal(b[0, 1], torch.arange(30) // 10)


def _press_slopes(n):
    # The published reference implementation (Press et al., 2022, attention_with_linear_biases).
    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + _press_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]


@pytest.mark.parametrize("n", range(1, 65))
def test_alibi_slopes_match_published_formula(n):
    s = alibi_slopes(n)
    assert s.dtype == torch.float32 and s.shape == (n,)
    assert torch.allclose(s, torch.tensor(_press_slopes(n), dtype=torch.float32), rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(sigma=0.0, num_samples=1), "sigma"),
        (dict(sigma=-1.0, num_samples=1), "sigma"),
        (dict(sigma=torch.tensor([1.0, float("nan")]), num_samples=1), "sigma"),
        (dict(sigma=1.0, num_samples=0), "num_samples"),
        (dict(sigma=1.0, num_samples=2, sampler="sobol"), "sampler"),
    ],
)
def test_bad_hash_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PositionalLSH(**kwargs)


# -- the sampler registry -------------------------------------------------------


def _antithetic_iid(lsh, t, h):
    """A toy sampler for the registry tests: i.i.d. pitches, antithetic shifts of pairs of samples."""
    import numpy as np

    from plsh_dist.hashing import counter_uniform

    a, b = counter_uniform(lsh.seed, t, h, 0), counter_uniform(lsh.seed, t, h, 1)
    c = counter_uniform(lsh.seed, t // 2, h, 2)
    return -np.log(a) - np.log(b), np.where(t % 2 == 1, 1.0 - c, c)


@pytest.fixture
def registry(monkeypatch):
    """The module's registries, restored after the test."""
    from plsh_dist import hashing

    monkeypatch.setattr(hashing, "_SAMPLERS", dict(hashing._SAMPLERS))
    return hashing


def test_a_registered_sampler_draws_the_masks(registry):
    registry.register_sampler("antithetic_iid", _antithetic_iid)
    registry.register_sampler("antithetic_iid", _antithetic_iid)  # a module imported twice: no-op
    lsh = PositionalLSH(8.0, 6, seed=5, sampler="antithetic_iid")
    iid = PositionalLSH(8.0, 6, seed=5)
    assert torch.equal(lsh.pitch, iid.pitch)  # same pitch streams
    unit = lsh.shift / lsh.pitch
    assert torch.allclose(unit[0::2] + unit[1::2], torch.ones_like(unit[0::2]), rtol=0, atol=1e-12)
    assert "antithetic_iid" in registry.sampler_names()
    with pytest.raises(ValueError, match="already registered"):
        registry.register_sampler("antithetic_iid", lambda lsh, t, h: _antithetic_iid(lsh, t, h))


def test_an_unregistered_sampler_names_the_registered_ones_and_how_to_register(registry):
    """What a config naming the lab's sampler meets where nothing imported the lab: the registry
    imports nothing by name itself."""
    from plsh_dist.models import AttentionConfig

    registry._SAMPLERS.pop("stratified_ramp", None)
    with pytest.raises(ValueError, match=r"attention.sampler must be one of \('iid', 'stratified'.*"
                                         r"got 'stratified_ramp'.*registers itself when its module is imported"):
        AttentionConfig(sampler="stratified_ramp")
    with pytest.raises(ValueError, match=r"sampler must be one of \('iid', 'stratified'"):
        PositionalLSH(1.0, 2, sampler=["iid"])
