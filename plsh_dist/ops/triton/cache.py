"""The fused kernel's one cache of tables: its band tables (:class:`KernelBias`), built once per hash
and tokens, and each kernel bias's near-block runs (:func:`near_args`), built once per kernel bias.

A :class:`~plsh_dist.ops.triton.kernel_bias.KernelBias` (block bounds, per-tile spans and band
limits of the forward, dK/dV and dQ kernels) is a pure function of the hash (its sampler,
samples, seed and sigma), the positions (and documents), causality, the tile shapes and the
device. The forward and backward of a call share one; so do the layers of a step that share a
hash (``fixed_masks``, or several calls of one layer). :func:`cached_kernel_bias` builds it on
the device (``KernelBias.of(..., by="kernels")``) and finds it again by those inputs without
reading device data: host values (ints, CPU tensors) by content, device tensors (a seed or
sigma that a graph carries) by identity and version counter, so an in-place change of a
tensor, or a new tensor at a reused address, is never mistaken for the old one.

Memory: the cache holds the most recent kernel bias, and the others only weakly: a kernel bias lives
while a caller (an autograd graph waiting for its backward) holds it, and is freed with
that graph. So it keeps at most one kernel bias's device tables beyond what autograd keeps,
until the next call with another hash (or :func:`clear`), and the entries for dead kernel biases are
dropped as new ones are added.
"""

from __future__ import annotations

import weakref

import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH
from plsh_dist.ops.triton.device_tables import device_near_blocks, draw_on_device
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.triton.kernel_bias import UNROLLED_SAMPLES, KernelBias
from plsh_dist.ops.triton.near_runs import NearBlocks, near_blocks
from plsh_dist.ops.triton.tile_bands import TileConfig, TokenLayout

#: key -> [(weakrefs to the device tensors in the key, weakref to the kernel bias)]
_entries: dict[tuple, list[tuple[tuple[weakref.ref, ...], weakref.ref]]] = {}
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
    seed = None if isinstance(lsh, FixedBlocks) else seed if isinstance(seed, int) else _token(seed, held)
    sigma = _token(sigma, held)
    if docs is None:
        tokens = (_token(positions, held),)
    else:
        ids = docs.doc if isinstance(docs, TokenLayout) else docs.ids
        tokens = (_token(docs.positions, held), _token(ids, held))
    hash_key = (type(lsh).__name__, lsh.sampler, lsh.num_samples, seed, sigma)
    return (hash_key, tokens, causal, tiles, str(device)), held


def cached_kernel_bias(lsh: PositionalLSH, positions: torch.Tensor, docs: Documents | TokenLayout | None,
                       causal: bool, device: torch.device,
                       tiles: tuple[TileConfig, TileConfig, TileConfig]) -> KernelBias:
    """The :class:`~plsh_dist.ops.triton.kernel_bias.KernelBias` of ``lsh`` over ``positions`` (and ``docs``: the
    host's documents, or their layout built on the device, :func:`~plsh_dist.ops.triton.device_tables.device_documents`)
    for the kernels' (forward, dK/dV, dQ) ``tiles`` on ``device``: the cached one when these inputs
    built one that is still alive, else a new one built on the device."""
    device = torch.device(device)
    key, held = _key(lsh, positions, docs, causal, tiles, device)
    for refs, ref in _entries.get(key, []):
        kb = ref()
        if kb is not None and all(r() is not None for r in refs):
            _last[0] = kb
            return kb
    layout = docs if isinstance(docs, TokenLayout) else TokenLayout.build(positions, device, docs)
    kb = KernelBias.of(draw_on_device(lsh, device), layout, causal, tiles, by="kernels")
    _builds[0] += 1
    for k in list(_entries):  # drop the entries of freed kernel biases and tensors
        _entries[k] = [(refs, r) for refs, r in _entries[k] if r() is not None and all(x() is not None for x in refs)]
        if not _entries[k]:
            del _entries[k]
    _entries.setdefault(key, []).append((tuple(held), weakref.ref(kb)))
    _last[0] = kb
    return kb


_NEAR: "weakref.WeakKeyDictionary[KernelBias, NearBlocks]" = weakref.WeakKeyDictionary()


def near_args(kb: KernelBias, device: torch.device) -> tuple:
    """The kernels' :attr:`NearBlocks.args` for ``kb`` (built once per kernel
    bias, freed with it), or dummies where the kernels do not read them (s <= UNROLLED_SAMPLES, window).

    On a device the table kernels build it (four launches, one allocation); on CPU tensors its torch
    reference does: Triton's interpreter runs ``tl.sort`` as a Python network, about half a second a
    program, too slow for a test suite (the kernels are held equal to it on small tables there)."""
    if kb.fwd.consts["MODE"] != 0 or kb.fwd.consts["NUM_SAMPLES"] <= UNROLLED_SAMPLES:
        return (kb.fwd.args[1],) * 5  # never read: any tensor of the call (no torch op)
    if kb not in _NEAR:
        build = near_blocks if device.type == "cpu" else device_near_blocks
        _NEAR[kb] = build(kb.fwd.args[1], kb.layout.doc)
    return _NEAR[kb].args
