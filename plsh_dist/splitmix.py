"""SplitMix64: the one counter-based mixer behind every seeded choice.

Hash pitches and shifts (:mod:`plsh_dist.hashing`), per-layer hash seeds
(:mod:`plsh_dist.models.runtime`) and the data order
(:mod:`plsh_dist.data.sampler`) are pure functions of small integer tuples,
mixed by the SplitMix64 finaliser (Steele et al., 2014) with wrap-around
uint64 arithmetic: the same numbers on every machine, process and numpy
version, no RNG state to save or to keep in step across ranks.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (element-wise, mod 2^64)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def splitmix64_int(x: int) -> int:
    """:func:`splitmix64` of one Python int (taken mod 2^64), as a Python int."""
    return int(splitmix64(np.array([x & MASK64], dtype=np.uint64))[0])


def hash_seed(run_seed: int, step: int, micro_step: int, layer: int) -> int:
    """Seed of one layer's hash in one forward, an int in [0, 2^63).

    A chained SplitMix64 of (run_seed, step, micro_step, layer): the same
    inputs give the same seed on every machine and Python process; changing
    any one input gives an unrelated seed. 63 bits so it fits a signed
    int64 (torch generators, numpy) as well as the hash's uint64 key.
    """
    for name, value in (("step", step), ("micro_step", micro_step), ("layer", layer)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if isinstance(run_seed, bool) or not isinstance(run_seed, int):
        raise ValueError(f"run_seed must be an int, got {run_seed!r}")
    key = splitmix64_int(run_seed & MASK64)
    for value in (step, micro_step, layer):
        key = splitmix64_int(key ^ value)
    return key >> 1
