"""SplitMix64, the one mixer behind hash draws, hash seeds and data order."""

import numpy as np

from plsh_dist.splitmix import splitmix64, splitmix64_int


def test_splitmix64_matches_published_sequence():
    # SplitMix64 seeded with 0 outputs 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, ...
    # (Vigna's reference splitmix64.c): output n is the finaliser of n * golden.
    assert splitmix64_int(0) == 0xE220A8397B1DCDAF
    assert splitmix64_int(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_array_and_int_forms_agree_and_wrap_mod_2_64():
    xs = [0, 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15]
    arr = splitmix64(np.array(xs, dtype=np.uint64))
    assert [int(a) for a in arr] == [splitmix64_int(x) for x in xs]
    assert splitmix64_int(-1) == splitmix64_int(2**64 - 1)  # taken mod 2^64
