"""The fused kernel's tables built on the device in a few launches, with no host read.

:func:`draw_on_device` gives a hash's pitch and shift on the attention's device from a
seed that may itself live there (a graph input), for every sampler with a device form
(:mod:`plsh_dist.ops.triton.device_draws`), equal to :class:`~plsh_dist.hashing.PositionalLSH`'s
numpy draws bit for bit under Triton's interpreter; compiled, the hash's ``log`` is CUDA's
(libdevice), which may differ from the CPU's in its last bit (docs/gpu.md). The other tables are
built on the device beside their host forms (``KernelBias.of(..., by="kernels")``,
``NearBlocks.of(..., by="kernels")``, ``TokenLayout.build_on_device``).

Legend: n tokens, s samples, Hh bias heads.
"""

from __future__ import annotations

import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, get_device_draw
from plsh_dist.ops.triton import device_draws  # noqa: F401  registers the package's samplers' device forms
from plsh_dist.ops.triton.cache import on_device
from plsh_dist.ops.triton.tile_bands import CountBias, num_tiles
from plsh_dist.ops.triton.runtime import launcher

_HASH_BLOCK = 256


def launch(device: torch.device):
    """The table kernels' module for tensors on ``device`` (tests wrap it to count host ops)."""
    return launcher("table_kernels", device)


def draw_on_device(lsh: PositionalLSH, device: torch.device) -> CountBias:
    """``lsh``'s pitch and shift, float64 (s, Hh) on ``device``, as a :class:`CountBias`, reading the seed
    (:attr:`PositionalLSH.seed_tensor`) and sigma on the device, nothing read back; a host sigma is copied
    by the first call only, so a later call (a CUDA graph's capture) copies nothing.

    Fixed blocks and the "iid" sampler: one launch of ``hash_draw_kernel``. Other samplers: their device
    form's unit draws (:func:`plsh_dist.hashing.register_sampler`) times sigma, the host's products.
    A sampler registered without a device form: its host draws on a CPU; elsewhere a ValueError."""
    device = torch.device(device)
    fixed = isinstance(lsh, FixedBlocks)
    # a host sigma is copied once, so a later call (a CUDA graph's capture) copies nothing
    sigma = on_device(lsh.given[1], device).reshape(-1).to(torch.float64)
    if not fixed and lsh.sampler != "iid":
        device_draw = get_device_draw(lsh.sampler)
        if device_draw is None:
            if device.type == "cpu":
                return CountBias.of(lsh, device)
            raise ValueError(
                f"sampler {lsh.sampler!r} has no device form, and the fused kernel draws its masks on {device}: "
                f"register one with it (register_sampler(name, draw, device_draw), see "
                f"plsh_dist.hashing.SamplerDeviceDraw), or run another backend than the fused kernel")
        gamma, unit_shift = device_draw(lsh, device)
        pitch = gamma * sigma  # the host's products (PositionalLSH._draw), exact on every device
        return CountBias(pitch, unit_shift * pitch)
    s, H = lsh.num_samples, lsh.num_heads
    draws = torch.empty(2, s, H, dtype=torch.float64, device=device)
    seed = sigma if fixed else lsh.seed_tensor.to(device, non_blocking=True)  # FIXED reads no seed
    launch(device).hash_draw_kernel[(num_tiles(s * H, _HASH_BLOCK),)](
        seed, sigma, draws[0], draws[1], s, H, FIXED=fixed, BLOCK=_HASH_BLOCK)
    return CountBias(draws[0], draws[1])
