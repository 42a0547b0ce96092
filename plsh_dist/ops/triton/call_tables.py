"""The tables one call of the fused kernels reads, found in the wing's cache or built there.

:func:`cached_kernel_bias`: a PLSH hash's :class:`~plsh_dist.ops.triton.kernel_bias.KernelBias`,
built on the call's device (the hash drawn there, ``CountBias.of(..., by="kernels")``;
the tables by the table kernels, ``KernelBias.of(..., by="kernels")``) and found again by later
calls with the same inputs (:mod:`plsh_dist.ops.triton.cache`). :func:`near_args`: the
runs table the kernels read beyond ``UNROLLED_SAMPLES`` samples, once per kernel bias.
"""

from __future__ import annotations

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.triton import cache
from plsh_dist.ops.triton.kernel_bias import UNROLLED_SAMPLES, KernelBias
from plsh_dist.ops.triton.near_runs import NearBlocks
from plsh_dist.ops.triton.tile_bands import CountBias, TileConfig
from plsh_dist.ops.triton.token_layout import TokenLayout


def cached_kernel_bias(lsh: PositionalLSH, positions: torch.Tensor, docs: Documents | TokenLayout | None,
                       causal: bool, device: torch.device,
                       tiles: tuple[TileConfig, TileConfig, TileConfig]) -> KernelBias:
    """The :class:`KernelBias` of ``lsh`` over ``positions`` (and ``docs``: the host's documents, or their
    layout built on the device, :meth:`TokenLayout.build_on_device`) for the
    kernels' (forward, dK/dV, dQ) ``tiles`` on ``device``: the cached one when these inputs built one
    that is still alive, else a new one built on the device."""
    device = torch.device(device)
    kb, key = cache.find_kernel_bias(lsh, positions, docs, causal, device, tiles)
    if kb is None:
        layout = docs if isinstance(docs, TokenLayout) else TokenLayout.build(positions, device, docs)
        kb = cache.keep_kernel_bias(key, KernelBias.of(CountBias.of(lsh, device, by="kernels"), layout, causal,
                                                       tiles, by="kernels"))
    return kb


def near_args(kb: KernelBias, device: torch.device) -> tuple:
    """The kernels' :attr:`~plsh_dist.ops.triton.near_runs.NearBlocks.args` for ``kb`` (built once per
    kernel bias, freed with it), or dummies where the kernels do not read them (s <= UNROLLED_SAMPLES,
    window).

    On a device the table kernels build it (``NearBlocks.of(..., by="kernels")``: four launches, one
    allocation); on CPU tensors its torch form does: Triton's interpreter runs ``tl.sort`` as a Python
    network, about half a second a program, too slow for a test suite (the kernels are held equal to it
    on small tables there)."""
    if kb.fwd.consts["MODE"] != 0 or kb.fwd.consts["NUM_SAMPLES"] <= UNROLLED_SAMPLES:
        return (kb.fwd.args[1],) * 5  # never read: any tensor of the call (no torch op)
    near = cache.find_near_blocks(kb)
    if near is None:
        by = "torch" if device.type == "cpu" else "kernels"
        near = cache.keep_near_blocks(kb, NearBlocks.of(kb.fwd.args[1], kb.layout.doc, by=by))
    return near.args
