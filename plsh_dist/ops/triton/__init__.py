"""The fused Triton kernel and everything only it uses: the one place the rest of the package meets it.

- ``attention.py``: the strategy (:class:`TritonOnePass`) and the launchers of the attention kernels
  (forward, dK/dV, dQ; PLSH's count bias or ALiBi's per-head window); ``kernels.py``: those kernels;
- its tables: ``token_layout.py`` (a row's tokens, laid out on the host or, packed documents, on the
  device), ``tile_bands.py`` (each tile's band of the other side: the host's reference and the
  planner's; and the hash's draws, ``CountBias.of``, copied from the host's or drawn on the device),
  ``kernel_bias.py`` (the tables a launch reads, and their one builder, by torch ops or by
  ``table_kernels.py``'s kernels), ``near_runs.py`` (a hash's blocks as runs of tokens, beyond the
  unrolled samples, and their one builder in the same two forms), ``device_draws.py`` +
  ``sampler_kernels.py`` (what the samplers draw with on the device: ``device_draws`` registers the
  package's samplers' device forms with :mod:`plsh_dist.hashing` when ``tile_bands`` loads it),
  ``call_tables.py`` (a call's tables, found in the cache or built);
- ``cache.py``: the one cache of the wing (host constants copied to a device once, kernel biases,
  near runs; one ``clear()``); ``runtime.py``: is Triton importable, interpreted, may a device's
  tensors be launched on.

Nothing here imports Triton at import time: the ``*kernels.py`` modules load by name where a kernel
runs (:func:`~plsh_dist.ops.triton.runtime.kernels_module`), so an export's bundled copy, which
leaves them out, runs without Triton.
"""

from plsh_dist.ops.triton.attention import (TritonOnePass, banded_backward, banded_forward, kernel_tiles, triton_cuda,
                                            triton_interpreter)
from plsh_dist.ops.triton.cache import device_constant, host_key
from plsh_dist.ops.triton.kernel_bias import KernelBias
from plsh_dist.ops.triton.near_runs import NEAR_ANCHOR, NearBlocks
from plsh_dist.ops.triton.tile_bands import (CountBias, TileConfig, WindowBias, block_bounds, key_spans, key_tile_bands,
                                             query_tile_bands, row_spans, tiles_for)
from plsh_dist.ops.triton.token_layout import TokenLayout

__all__ = [
    "TritonOnePass", "banded_backward", "banded_forward", "kernel_tiles", "triton_cuda", "triton_interpreter",
    "device_constant", "host_key",
    "KernelBias", "NEAR_ANCHOR", "NearBlocks", "CountBias", "TileConfig", "TokenLayout", "WindowBias",
    "block_bounds", "key_spans", "key_tile_bands", "query_tile_bands", "row_spans", "tiles_for",
]
