"""What every rank of an SP group must agree on, checked once per attention call.

Each sequence-parallel attention call starts with one small all-gather
(:func:`plsh_dist.distributed.group_chunks.exchange_chunks`) of the rank's chunk
and of this signature: batch, heads, head dim, dtype, causal flag, softmax
scale, whether a backward will run, and the algorithm's own parameters (hash
fingerprint, slopes, window). A mismatch raises the same ValueError on every
rank before any K/V moves.
"""

from __future__ import annotations

import struct
import zlib

import torch

from plsh_dist.distributed.group_chunks import dtype_code

_OPS = {"plsh": 1, "alibi_gather": 2, "alibi_window": 3}


def call_signature(op: str, q, k, causal: bool, scale: float, needs_grad: bool, **extra) -> dict[str, int]:
    """Everything that must agree across the SP group, as ints (``op`` names the algorithm)."""
    sig = {
        "op": _OPS[op], "batch": q.shape[0], "q_heads": q.shape[2], "kv_heads": k.shape[2],
        "head_dim": q.shape[3], "dtype": dtype_code(q.dtype), "causal": int(causal),
        "softmax_scale_bits": struct.unpack("<q", struct.pack("<d", float(scale)))[0],
        "requires_grad": int(needs_grad),
    }
    sig.update({key: int(value) for key, value in extra.items()})
    return sig


def slopes_crc(slopes: torch.Tensor) -> int:
    """CRC32 of the ALiBi slopes (float32 bytes): equal iff ranks use the same slopes."""
    return zlib.crc32(slopes.to(torch.float32).numpy().tobytes())


def window_code(window: int | tuple[int, ...]) -> int:
    """A window as one int: itself, or for per-head windows ``-1 - CRC32`` of their int64
    bytes (negative, so never equal to a shared window)."""
    if isinstance(window, tuple):
        return -1 - zlib.crc32(torch.tensor(window, dtype=torch.int64).numpy().tobytes())
    return int(window)
