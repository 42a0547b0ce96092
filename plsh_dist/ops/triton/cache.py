"""The fused kernel's one cache: everything its wing keeps between calls, and one :func:`clear`.

- **Device constants** (:func:`device_constant`, :func:`on_device`): small host constants (a
  hash's sigma, ALiBi's slopes and windows, a sampler's index grids) on a device, made once. The
  models pass them as CPU tensors (constants of a compiled graph). Copying one to the GPU at every
  call would make the call impossible to capture in a CUDA graph: a copy from pageable host memory
  is refused during a capture (or, where it is not, replays read host memory that may be gone). So
  each distinct constant is copied (and checked) once, at its first call (a warm-up step), and
  later calls, a capture among them, find the copy by the constant's bytes, with no torch op and
  no copy. At most :data:`MAX_CONSTANTS` are kept, the oldest dropped first.
- **Kernel biases** (:func:`find_kernel_bias`, :func:`keep_kernel_bias`): a
  :class:`~plsh_dist.ops.triton.kernel_bias.KernelBias` is a pure function of the hash (its
  sampler, samples, seed and sigma), the positions (and documents), causality, the tile shapes and
  the device. The forward and backward of a call share
  one; so do the layers of a step that share a hash (``fixed_masks``, or several calls of one
  layer). It is found again by those inputs without reading device data: host values (ints, CPU
  tensors) by content, device tensors (a seed or sigma that a graph carries) by identity and
  version counter, so an in-place change of a tensor, or a new tensor at a reused address, is
  never mistaken for the old one.
- **Near runs** (:func:`find_near_blocks`, :func:`keep_near_blocks`): a kernel bias's runs table
  beyond ``UNROLLED_SAMPLES`` samples, made once per kernel bias and freed with it.

The cache finds and keeps; its callers (:mod:`plsh_dist.ops.triton.call_tables`) build what it keeps,
so the table builders, which read the device constants, import it and it imports none of them (the
types it keeps, :class:`~plsh_dist.ops.triton.kernel_bias.KernelBias`,
:class:`~plsh_dist.ops.triton.near_runs.NearBlocks` and the kernels'
:class:`~plsh_dist.ops.triton.tile_bands.TileConfig`, are named in its docstrings, not imported).

Memory: the cache holds the most recent kernel bias, and the others only weakly: a kernel bias lives
while a caller (an autograd graph waiting for its backward) holds it, and is freed with
that graph. So it keeps at most one kernel bias's device tables beyond what autograd keeps,
until the next call with another hash (or :func:`clear`), and the entries for dead kernel biases are
dropped as new ones are added.
"""

from __future__ import annotations

import weakref
from typing import Callable, TypeVar

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.triton.token_layout import TokenLayout

T = TypeVar("T")

#: most constants kept: a model has a few (one per bias config and head count); the oldest go first
MAX_CONSTANTS = 256
#: key -> a constant made on a device (:func:`device_constant`)
_constants: dict[tuple, object] = {}
#: key -> [(weakrefs to the device tensors in the key, weakref to the kernel bias)]
_entries: dict[tuple, list[tuple[tuple[weakref.ref, ...], weakref.ref]]] = {}
#: the most recent kernel bias, held strongly (calls without autograd share it too)
_last: list = [None]
#: kernel biases built so far (tests count the builds)
_builds = [0]
#: kernel bias -> its near runs, freed with it
_near: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def clear() -> None:
    """Forget every constant, kernel bias and runs table (their device memory is freed once no graph
    holds them); the next call makes them again."""
    _constants.clear()
    _entries.clear()
    _last[0] = None
    _near.clear()


# -- device constants -------------------------------------------------------------------------


def host_key(x: torch.Tensor) -> tuple:
    """What identifies a CPU tensor's value, read with no torch op: dtype, shape and bytes."""
    flat = x.detach().reshape(-1)
    return str(x.dtype), tuple(x.shape), flat.view(torch.uint8).numpy().tobytes()


def device_constant(key: tuple, make: Callable[[], T]) -> T:
    """``make()``, made once per ``key`` (a hashable description of its value and device) and kept
    until :data:`MAX_CONSTANTS` newer ones were made. Do not modify what it returns."""
    if key not in _constants:
        if len(_constants) >= MAX_CONSTANTS:
            del _constants[next(iter(_constants))]
        _constants[key] = make()
    return _constants[key]


def on_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device``: itself if it is there, else a copy (kept, and found again by the bytes of a
    CPU tensor with :func:`device_constant`)."""
    device = torch.device(device)
    if x.device == device:
        return x
    if x.device.type != "cpu":
        return x.to(device)
    return device_constant(("on_device", str(device), *host_key(x)),
                           lambda: x.detach().to(device, copy=True).contiguous())


# -- kernel biases ----------------------------------------------------------------------------


def builds() -> int:
    """How many kernel biases :func:`keep_kernel_bias` has kept (built) in this process."""
    return _builds[0]


def _token(x, held: list) -> tuple | None:
    """What identifies ``x`` in a key, read without a torch op or a device read: a CPU tensor by its
    bytes, a device tensor by identity and version (appended to ``held`` to check it is alive)."""
    if x is None:
        return None
    if x.device.type == "cpu":
        return str(x.dtype), tuple(x.shape), x.detach().numpy().tobytes()
    held.append(weakref.ref(x))
    return "device", id(x), x._version


def _key(lsh: PositionalLSH, positions, docs: Documents | TokenLayout | None, causal: bool, tiles,
         device) -> tuple[tuple, list]:
    held: list = []
    seed, sigma = lsh.given
    seed = None if lsh.fixed else seed if isinstance(seed, int) else _token(seed, held)
    sigma = _token(sigma, held)
    if docs is None:
        tokens = (_token(positions, held),)
    else:
        ids = docs.doc if isinstance(docs, TokenLayout) else docs.ids
        tokens = (_token(docs.positions, held), _token(ids, held))
    hash_key = (type(lsh).__name__, lsh.sampler, lsh.num_samples, seed, sigma)
    return (hash_key, tokens, causal, tiles, str(device)), held


def find_kernel_bias(lsh: PositionalLSH, positions: torch.Tensor, docs: Documents | TokenLayout | None,
                     causal: bool, device: torch.device, tiles: tuple) -> tuple:
    """``(kernel bias, key)``: the :class:`~plsh_dist.ops.triton.kernel_bias.KernelBias` these inputs built,
    while it is alive, else None, and the key to :func:`keep_kernel_bias` a new one under. ``lsh``,
    ``positions``, ``docs`` (the host's documents, or their layout built on the device), ``causal``,
    ``device`` and the kernels' (forward, dK/dV, dQ) ``tiles`` (three
    :class:`~plsh_dist.ops.triton.tile_bands.TileConfig`) make the key."""
    key, held = _key(lsh, positions, docs, causal, tiles, torch.device(device))
    for refs, ref in _entries.get(key, []):
        kb = ref()
        if kb is not None and all(r() is not None for r in refs):
            _last[0] = kb
            return kb, (key, held)
    return None, (key, held)


def keep_kernel_bias(key: tuple, kb):
    """``kb`` (a :class:`~plsh_dist.ops.triton.kernel_bias.KernelBias`), kept under ``key``
    (:func:`find_kernel_bias`'s) while it is alive, and strongly until the next."""
    key, held = key
    _builds[0] += 1
    for k in list(_entries):  # drop the entries of freed kernel biases and tensors
        _entries[k] = [(refs, r) for refs, r in _entries[k] if r() is not None and all(x() is not None for x in refs)]
        if not _entries[k]:
            del _entries[k]
    _entries.setdefault(key, []).append((tuple(held), weakref.ref(kb)))
    _last[0] = kb
    return kb


# -- near runs --------------------------------------------------------------------------------


def find_near_blocks(kb):
    """``kb``'s near runs (a :class:`~plsh_dist.ops.triton.near_runs.NearBlocks`), if kept
    (:func:`keep_near_blocks`), else None."""
    return _near.get(kb)


def keep_near_blocks(kb, near):
    """``near`` (a :class:`~plsh_dist.ops.triton.near_runs.NearBlocks`), kept as ``kb``'s near runs until
    ``kb`` (a :class:`~plsh_dist.ops.triton.kernel_bias.KernelBias`) is freed."""
    _near[kb] = near
    return near
