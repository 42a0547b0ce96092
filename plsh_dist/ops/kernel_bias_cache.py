"""A cache of the fused kernel's band tables (:class:`KernelBias`), built once per hash and tokens.

A :class:`~plsh_dist.ops.kernel_bias.KernelBias` (block bounds, per-tile spans and band
limits of the forward, dK/dV and dQ kernels) is a pure function of the hash's pitch and
shift, the positions (and documents), causality, the tile shapes and the device. The
forward and backward of a call share one; so do the layers of a step that share a hash
(``fixed_masks``, or several calls of one layer). :func:`cached_kernel_bias` finds it by
exactly those inputs: the pitch, shift and shapes in the key, the positions (and document ids)
compared by content, so an in-place change of a positions tensor, or a new tensor at a
reused address, is never mistaken for the old one.

Memory: the cache holds the most recent kernel bias, and the others only weakly: a kernel bias lives
while a caller (an autograd graph waiting for its backward) holds it, and is freed with
that graph. So it keeps at most one kernel bias's device tables beyond what autograd keeps,
until the next call with another hash (or :func:`clear`), and the entries for dead kernel biases are
dropped as new ones are added.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.kernel_bias import KernelBias
from plsh_dist.ops.tile_bands import CountBias, TileConfig, TokenLayout

#: (pitch, shift, shapes, causal, head_dim, device) -> [(token arrays, weakref to the kernel bias)]
_entries: dict[tuple, list[tuple[tuple[np.ndarray, ...], weakref.ref]]] = {}
#: the most recent kernel bias, held strongly (calls without autograd share it too)
_last: list = [None]
#: kernel biases built so far (tests count the builds)
_builds = [0]


def builds() -> int:
    """How many kernel biases :func:`cached_kernel_bias` has built in this process."""
    return _builds[0]


def clear() -> None:
    """Forget every kernel bias (their tables are freed once no graph holds them)."""
    _entries.clear()
    _last[0] = None


def _tokens(positions: torch.Tensor, docs: Documents | None) -> tuple[np.ndarray, ...]:
    """What the layout is built from, as CPU arrays (no torch op)."""
    if docs is None:
        return (positions.cpu().numpy(),)
    return docs.positions.cpu().numpy(), docs.ids.cpu().numpy()


def cached_kernel_bias(lsh: PositionalLSH, positions: torch.Tensor, docs: Documents | None, causal: bool,
                       device: torch.device, tiles: tuple[TileConfig, TileConfig, TileConfig]) -> KernelBias:
    """The :class:`~plsh_dist.ops.kernel_bias.KernelBias` of ``lsh`` over CPU ``positions``
    (and ``docs``) for the kernels' (forward, dK/dV, dQ) ``tiles`` on ``device``: the cached
    one when these inputs built one that is still alive, else a new one."""
    device = torch.device(device)
    pitch, shift = lsh.pitch.numpy(), lsh.shift.numpy()
    key = (pitch.tobytes(), shift.tobytes(), pitch.shape, causal, tiles, str(device))
    tokens = _tokens(positions, docs)
    held = _entries.setdefault(key, [])
    for arrays, ref in held:
        kb = ref()
        same = len(arrays) == len(tokens) and all(np.array_equal(a, b) for a, b in zip(arrays, tokens))
        if kb is not None and same:
            _last[0] = kb
            return kb
    kb = KernelBias.of(CountBias.of(lsh, device), TokenLayout.build(positions, device, docs), causal, tiles)
    _builds[0] += 1
    for k in list(_entries):  # drop the entries of freed kernel biases
        _entries[k] = [(a, r) for a, r in _entries[k] if r() is not None]
        if not _entries[k] and k != key:
            del _entries[k]
    _entries[key].append((tuple(a.copy() for a in tokens), weakref.ref(kb)))
    _last[0] = kb
    return kb
