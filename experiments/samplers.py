"""Experimental samplers of :class:`plsh_dist.hashing.PositionalLSH`, registered on import.

- ``"stratified_ramp"``: fewer shared-pitch groups than ``"stratified"``, sizes
  growing with the pitch quantile, antithetic (mirror) pitch jitter;
- ``"stratified_ramp_alt"``: the same groups, one jitter per head alternating
  ``v, 1 - v`` between neighbouring strata.

Both are unbiased (``E[M~] = L*``) and reach i.i.d.'s max-norm mask error with
fewer samples, but no config recommends them: their training gradients are
further from exact ALiBi's than i.i.d.'s from s = 20 on
(``results/grad_fidelity``). So they live with the studies that measure them
(``experiments/sampler_ratio.py``, ``results/sampler``). Importing the
``experiments`` package imports this module; a run config that names one of them
sets ``[attention].sampler_module = "experiments.samplers"``, which the config
imports before it checks the sampler. Each has a device form (:func:`ramp_device_draws`), so the
fused kernel draws its masks on the GPU.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from plsh_dist.hashing import PositionalLSH, counter_uniform, gamma2_ppf, register_sampler
from plsh_dist.ops.triton import device_draws

__all__ = ["ramp_draws", "ramp_device_draws", "ramp_sizes", "RAMP_GROUPS", "NAMES"]

#: Groups per ``sqrt(s)`` of the ramp samplers: ``G = round(0.75 sqrt(s))``.
RAMP_GROUPS = 0.75


def ramp_sizes(s: int, num_groups: int) -> np.ndarray:
    """Group sizes of the ramp samplers: proportional to 1, 2, ..., G, rounded by largest
    remainder to integers >= 1 that sum to ``s`` (``G <= s``)."""
    weight = np.arange(1, num_groups + 1, dtype=np.float64)
    raw = s * weight / weight.sum()
    sizes = np.maximum(1, np.floor(raw)).astype(np.int64)
    while sizes.sum() < s:
        sizes[np.argmax(raw - sizes)] += 1
    while sizes.sum() > s:
        sizes[np.argmax(np.where(sizes > 1, sizes - raw, -np.inf))] -= 1
    return sizes


def ramp_draws(lsh: PositionalLSH, t: np.ndarray, h: np.ndarray,
               jitter: str = "mirror") -> tuple[np.ndarray, np.ndarray]:
    """Ramped, antithetic stratified Gamma(2, 1) draws and unit shifts, ndarray[s, H] each
    (streams 6-8 of :func:`counter_uniform`).

    Why: with ``k`` equally spaced shifts under one pitch, a group's collision
    fraction of a pair is off by ``(B - f) / k``, ``B`` a coin and ``f`` the
    fractional part of ``k (1 - d / delta)``; weighted by its share ``k / s``
    of the samples, each group adds ``(B - f) / s`` whatever its size. Over
    ``n`` positions some pair sees every group's error with the same sign, so
    the max-norm error of the shift part is about ``0.75 G / s``: fewer groups
    help, while the pitch part (a ``G``-point quadrature of
    ``E[max(0, 1 - d / delta)]``) wants more. So, against ``"stratified"``:

    - ``G = round(0.75 sqrt(s))`` groups (fewer), sizes ``k_g`` proportional
      to ``g + 1`` (a ramp: more shifts under the larger pitches), each >= 1;
    - group ``g`` owns the pitch-quantile stratum ``[K_g / s, (K_g + k_g) / s)``
      (``K_g`` = samples in the groups before it), the width of its share;
    - ``jitter="mirror"``: the jitters of groups ``g`` and ``G - 1 - g`` are
      antithetic (``v`` and ``1 - v`` inside their strata; the collision
      fraction is monotone in the pitch, so their errors partly cancel);
      ``jitter="alternate"``: one ``v`` per head, group ``g`` at ``v`` for even
      ``g`` and ``1 - v`` for odd ``g`` (neighbouring strata have nearly the
      same slope of the collision fraction in the quantile, so their
      first-order errors cancel);
    - each group's ``k_g`` samples share that pitch and take the equally
      spaced unit shifts ``frac(c_g + m / k_g)``;
    - which sample falls in which group's slot is a uniform random
      permutation per head.

    Unbiased: given its stratum a group's quantile is uniform there (``v``
    and ``1 - v`` are both U(0, 1)), and its shifts are U(0, 1) given the
    pitch, so ``E[M~] = sum_g (k_g / s) E[M | stratum g] = L*`` (dependent
    jitters across groups are allowed: the expectation is a sum over groups);
    with the random slot each sample's own marginal is exactly Gamma(2, sigma)
    x Uniform[0, delta) too. The sizes and ``0.75`` are measured choices
    (``results/sampler``).
    """
    if jitter not in ("mirror", "alternate"):
        raise ValueError(f"jitter must be 'mirror' or 'alternate', got {jitter!r}")
    s = lsh.num_samples
    num_groups = max(1, round(RAMP_GROUPS * math.sqrt(s)))
    sizes = ramp_sizes(s, num_groups)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    g, hg = np.meshgrid(np.arange(num_groups), h[0], indexing="ij")  # (G, H)
    if jitter == "alternate":
        v = counter_uniform(lsh.seed, np.zeros_like(g), hg, 6)  # one v per head, (G, H)
        v = np.where(g % 2 == 1, 1.0 - v, v)
    else:
        mirror = num_groups - 1 - g
        v = counter_uniform(lsh.seed, np.minimum(g, mirror), hg, 6)
        v = np.where(g > mirror, 1.0 - v, v)
    quantile = (first[g] + sizes[g] * v) / s
    base_shift = counter_uniform(lsh.seed, g, hg, 7)
    # slot[t, h]: rank of sample t among the head's s uniforms, a uniform random permutation.
    slot = np.argsort(np.argsort(counter_uniform(lsh.seed, t, h, 8), axis=0, kind="stable"), axis=0,
                      kind="stable")
    group = np.searchsorted(first, slot, side="right") - 1
    member = slot - first[group]
    unit_shift = np.mod(base_shift[group, h] + member / sizes[group], 1.0)
    return gamma2_ppf(quantile)[group, h], unit_shift


def _ramp_constants(s: int, H: int, jitter: str) -> tuple[np.ndarray, ...]:
    """The host's arrays of :func:`ramp_draws` for ``s`` samples and ``H`` heads: the (G, H) grid's
    index of stream 6 (the jitter's), its heads, group indices, which jitters flip to ``1 - v``, the
    groups' first quantile slot and size (float64), ``s`` (float64 [1]: a divisor); and per slot
    ``< s`` its group and shift offset ``member / size``."""
    num_groups = max(1, round(RAMP_GROUPS * math.sqrt(s)))
    sizes = ramp_sizes(s, num_groups)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    g, hg = np.meshgrid(np.arange(num_groups), np.arange(H), indexing="ij")
    if jitter == "alternate":
        jitter_index, flip = np.zeros_like(g), g % 2 == 1
    else:
        mirror = num_groups - 1 - g
        jitter_index, flip = np.minimum(g, mirror), g > mirror
    slot = np.arange(s)
    group = np.searchsorted(first, slot, side="right") - 1
    return (jitter_index, hg, g, flip, first[g].astype(np.float64), sizes[g].astype(np.float64),
            np.array([s], dtype=np.float64), group, (slot - first[group]) / sizes[group])


def ramp_device_draws(lsh: PositionalLSH, device: torch.device,
                      jitter: str = "mirror") -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ramp_draws` on ``device`` (its device form, :data:`plsh_dist.hashing.SamplerDeviceDraw`):
    float64 Tensor[s, H] unit pitches and shifts from the seed there, equal to the host's under Triton's
    interpreter; the host arrays are copied to the device by the first call only."""
    if jitter not in ("mirror", "alternate"):
        raise ValueError(f"jitter must be 'mirror' or 'alternate', got {jitter!r}")
    s, H = lsh.num_samples, lsh.num_heads
    (jitter_index, hg, g, flip, first, sizes, total, slot_group, slot_offset) = device_draws.constants(
        ("stratified_ramp", jitter, s, H), lambda: _ramp_constants(s, H, jitter), device)
    seed = device_draws.seed_on(lsh, device)
    t, h = device_draws.grid(s, H, device)
    v = device_draws.uniforms(seed, jitter_index, hg, 6)[0]
    v = torch.where(flip, 1.0 - v, v)
    quantile = (first + sizes * v) / total
    base_shift = device_draws.uniforms(seed, g, hg, 7)[0]
    # slot[t, h]: rank of sample t among the head's s uniforms (stable argsorts, as the host's)
    slot = torch.argsort(torch.argsort(device_draws.uniforms(seed, t, h, 8)[0], dim=0, stable=True), dim=0,
                         stable=True)
    group = slot_group[slot]
    unit_shift = torch.remainder(torch.gather(base_shift, 0, group) + slot_offset[slot], 1.0)
    return torch.gather(device_draws.gamma2_ppf(quantile), 0, group), unit_shift


#: The samplers this module registers: a run config naming one sets ``[attention].sampler_module``
#: to this module's name.
NAMES = ("stratified_ramp", "stratified_ramp_alt")

register_sampler(NAMES[0], ramp_draws, ramp_device_draws)
register_sampler(NAMES[1], functools.partial(ramp_draws, jitter="alternate"),
                 functools.partial(ramp_device_draws, jitter="alternate"))
