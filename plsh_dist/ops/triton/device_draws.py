"""Samplers drawn on the device: what a sampler's device form draws with, and the package's own forms.

A sampler's device form (:data:`plsh_dist.hashing.SamplerDeviceDraw`) computes on the attention's
device what its numpy form computes on the host, from the seed tensor there, so nothing is read
back or copied from the host once its constants are there (a CUDA graph replays it with the step's
new seed). It equals the numpy form bit for bit under Triton's interpreter when it keeps to:

- randomness from :func:`uniforms` (:func:`~plsh_dist.hashing.counter_uniform`), logarithms from
  :func:`log`, Gamma(2, 1) quantiles from :func:`gamma2_ppf` (kernels that mirror numpy's arithmetic;
  torch's own ``log`` or ``exp`` may differ from numpy's in the last bit, by CPU model);
- otherwise correctly rounded torch ops: float64 ``+ - * /``, ``floor``, ``remainder``, comparisons,
  ``where``, indexing and ``gather``, ``argsort(stable=True)`` of distinct keys;
- a divisor that is a tensor on the device, never a Python number (CUDA multiplies by a scalar
  divisor's reciprocal, which is not always the quotient), and int64 made float64 before a
  division (torch divides integers in float32);
- host arrays (index grids, group sizes: functions of ``s`` and ``H``) from :func:`constants`,
  copied to the device once per key.

Compiled, the kernels' ``log``, ``exp``, ``log1p`` and ``expm1`` are CUDA's, which may differ from the
CPU's in the last bit (as the "iid" kernel's, docs/gpu.md).

Legend: s samples, H hash heads, G groups of samples.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch

from plsh_dist.ops.triton.cache import device_constant
from plsh_dist.ops.triton.runtime import launcher

from plsh_dist.hashing import PositionalLSH, register_device_draw

_BLOCK = 256
#: gamma2_ppf_kernel's lanes per step of its one program
_PPF_BLOCK = 1024


def launch(device: torch.device):
    """The sampler kernels' module for tensors on ``device`` (tests wrap it to count host ops)."""
    return launcher("sampler_kernels", device)


def seed_on(lsh: PositionalLSH, device: torch.device) -> torch.Tensor:
    """``lsh``'s seed as an int64 scalar tensor on ``device``: the given one where it is there already (a
    compiled model's), else a copy (an int seed: one small copy)."""
    return lsh.seed_tensor.to(device, non_blocking=True)


def constants(key: tuple, make: Callable[[], Sequence[np.ndarray]], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``make()``'s numpy arrays as tensors on ``device`` (their dtypes kept), made and copied once per
    ``key`` (hashable: the sampler's name and whatever the arrays depend on, e.g. ``(name, s, H)``) and
    device, found again with no torch op. Do not modify them."""
    device = torch.device(device)
    return device_constant(("sampler constants", str(device), *key),
                           lambda: tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in make()))


def grid(s: int, H: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t, h)``: the sample and head index of every (sample, head), int64 [s, H] each on ``device``
    (the host's ``np.meshgrid(arange(s), arange(H), indexing="ij")``)."""
    return constants(("grid", s, H), lambda: np.meshgrid(np.arange(s), np.arange(H), indexing="ij"), device)


def uniforms(seed: torch.Tensor, t: torch.Tensor, h: torch.Tensor, first_stream: int,
             num_streams: int = 1) -> torch.Tensor:
    """``counter_uniform(seed, t, h, first_stream + k)`` for ``k < num_streams``: float64
    [num_streams, *t.shape] on ``t``'s device, one launch. ``seed``: an int64 scalar tensor there;
    ``t``, ``h``: contiguous int64 index tensors of one shape there."""
    if t.shape != h.shape or t.dtype != torch.int64 or h.dtype != torch.int64:
        raise ValueError(f"t and h must be int64 tensors of one shape, got {t.dtype} {tuple(t.shape)} and "
                         f"{h.dtype} {tuple(h.shape)}")
    out = torch.empty((num_streams, *t.shape), dtype=torch.float64, device=t.device)
    n = t.numel()
    launch(t.device).uniform_kernel[(max(1, -(-n // _BLOCK)),)](
        seed, t, h, out, n, first_stream, NUM_STREAMS=num_streams, BLOCK=_BLOCK)
    return out


def log(x: torch.Tensor) -> torch.Tensor:
    """``np.log`` of a contiguous float64 tensor, element by element, on its device (one launch)."""
    out = torch.empty_like(x)
    n = x.numel()
    launch(x.device).log_kernel[(max(1, -(-n // _BLOCK)),)](x, out, n, BLOCK=_BLOCK)
    return out


def gamma2_ppf(q: torch.Tensor) -> torch.Tensor:
    """:func:`plsh_dist.hashing.gamma2_ppf` of a contiguous float64 tensor of quantiles, on its device:
    one launch of one program, which stops when every element has converged, as the host does (so the
    result of each element depends on the whole tensor: pass the array the host's form passes)."""
    out = torch.empty_like(q)
    launch(q.device).gamma2_ppf_kernel[(1,)](q, out, q.numel(), BLOCK=_PPF_BLOCK)
    return out


# -- the package's samplers ---------------------------------------------------------------------------


def iid_draws(lsh: PositionalLSH, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``hashing._iid_draws`` on ``device``: float64 [s, H] unit pitches and shifts.
    (:meth:`~plsh_dist.ops.triton.tile_bands.CountBias.of`, ``by="kernels"``, draws "iid" with sigma in one
    launch instead.)"""
    t, h = grid(lsh.num_samples, lsh.num_heads, device)
    abc = uniforms(seed_on(lsh, device), t, h, 0, 3)
    logs = log(abc[:2])
    return -logs[0] - logs[1], abc[2]


def _stratified_constants(s: int, H: int) -> tuple[np.ndarray, ...]:
    """The host's arrays of ``hashing._stratified_draws`` for ``s`` samples and ``H`` heads: the group
    and head grid (G, H), each sample's group (s, H), its shift offset ``member / group size`` (s, H,
    float64) and G (float64 [1]: a divisor)."""
    num_groups = max(1, round(math.sqrt(s)))
    sizes = np.full(num_groups, s // num_groups)
    sizes[: s % num_groups] += 1
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    t, _ = np.meshgrid(np.arange(s), np.arange(H), indexing="ij")
    group = np.searchsorted(first, t, side="right") - 1
    g, hg = np.meshgrid(np.arange(num_groups), np.arange(H), indexing="ij")
    return g, hg, group, (t - first[group]) / sizes[group], np.array([num_groups], dtype=np.float64)


def stratified_draws(lsh: PositionalLSH, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``hashing._stratified_draws`` on ``device``: float64 [s, H] unit pitches and shifts."""
    s, H = lsh.num_samples, lsh.num_heads
    g, hg, group, offset, num_groups = constants(("stratified", s, H), lambda: _stratified_constants(s, H), device)
    u3, u4, u5 = uniforms(seed_on(lsh, device), g, hg, 3, 3)
    stratum = torch.argsort(u5, dim=0, stable=True)
    quantile = (stratum + u3) / num_groups
    unit_shift = torch.remainder(torch.gather(u4, 0, group) + offset, 1.0)  # x - floor(x): exact
    return torch.gather(gamma2_ppf(quantile), 0, group), unit_shift


# The package's samplers' device forms (their host forms: plsh_dist.hashing). Registered here, when the
# module that draws on a device is loaded (tile_bands, CountBias.of's home, imports it before any draw).
register_device_draw("iid", iid_draws)
register_device_draw("stratified", stratified_draws)
