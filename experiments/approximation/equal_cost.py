"""Truncated ALiBi at positional LSH's cost: the window that attends as many keys as the one-pass band.

Positional LSH in one pass (DESIGN 2b) attends, for query ``i``, the band of
keys from the earliest start of the ``s`` blocks holding ``i`` up to ``i``
(causal), or up to the latest end of those blocks (non-causal).  Under the
hash, ``i - start_t(i) >= d`` exactly when ``i - d`` shares ``i``'s bucket
(blocks are contiguous), so ``P[i - start_t(i) >= d] = exp(-d / sigma)`` for
integer ``d >= 0``; with independent samples (the i.i.d. sampler)

    E[keys before i] = sum_{d >= 1} 1 - (1 - e^{-d / sigma})^s  ~  sigma * H_s  ~  sigma (ln s + 0.58)

(``H_s = ln s + 0.5772 + 1 / (2 s) - ...`` the harmonic number: the mean of
the largest of ``s`` Exp(sigma) draws).  Exact ALiBi truncated at a window
``w`` (keys with ``|i - j| < w``, the project's window convention) attends
``w`` keys per causal query, ``w - 1`` of them before ``i``, and drops only
weights below ``e^{-w / sigma}``.  So ``w_h = ceil(c * sigma_h)`` with
``c = ln s + 0.58`` is truncated ALiBi at the cost of ``s`` samples.

:func:`band_keys` measures the band with the project's own hash
(:meth:`PositionalLSH.block_bounds`, the same arithmetic as the one-pass op),
for any sampler; :func:`iid_band_keys` is the exact expectation above.

Shape legend: s samples, H hash heads, m query positions.
"""

from __future__ import annotations

import math

import torch

from plsh_dist.hashing import PositionalLSH, _as_sigma
from plsh_dist.ops.alibi import equal_cost_c, truncation_windows


def equal_cost_window(sigma, num_samples: int) -> torch.Tensor:
    """``w_h = ceil(c * sigma_h)`` with ``c = equal_cost_c(s)``, LongTensor[H] (H = 1 for a float sigma)."""
    return truncation_windows(equal_cost_c(num_samples), _as_sigma(sigma))


def window_keys(window: int, causal: bool = True) -> int:
    """Keys a query attends under a window ``w`` (``|i - j| < w``), away from the sequence's ends."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return window if causal else 2 * window - 1


def band_keys(hash_: PositionalLSH, positions: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Keys in each query's one-pass band (the query included), float64 Tensor[H, m].

    Causal: ``i - min_t start_t(i) + 1``; non-causal: ``max_t end_t(i) - min_t start_t(i)``
    (``end`` the first position after the block).  Block bounds are not clipped
    to 0: the hash is stationary in position (its shift is uniform over the
    pitch), so every position measures what an interior query attends.

    Args:
        hash_: the hash (any sampler, any number of samples).
        positions: CPU LongTensor[m] of query positions.
    """
    out = []
    for h in range(hash_.num_heads):
        starts, ends = hash_.block_bounds(positions, h, ends=not causal)  # (s, m) each
        first = starts.min(dim=0).values
        last = positions + 1 if causal else ends.max(dim=0).values
        out.append((last - first).to(torch.float64))
    return torch.stack(out)


def iid_band_keys(sigma: float, num_samples: int, causal: bool = True) -> float:
    """Exact expected band of the i.i.d. sampler: ``1 + E[max_t (i - start_t(i))]`` (causal),
    ``1 + 2 E[max_t (i - start_t(i))]`` (non-causal: the end side has the same law, and
    the mean of a sum is the sum of means)."""
    sig = float(sigma)
    if not (sig > 0 and math.isfinite(sig)):
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    # Terms fall like s e^{-d / sigma}: past d = sigma (ln s + 40) they are below 1e-17.
    d = torch.arange(1, math.ceil(sig * (math.log(num_samples) + 40)) + 1, dtype=torch.float64)
    # 1 - (1 - p)^s without cancellation for small p = e^{-d / sigma}.
    tail = -torch.expm1(num_samples * torch.log1p(-torch.exp(-d / sig)))
    before = float(tail.sum())
    return 1.0 + (before if causal else 2.0 * before)
