"""Who holds which positions in a sequence-parallel group, validated loudly.

Every SP attention call starts with one tiny all-gather of
``(first position, last position, chunk length, call signature...)`` per rank.
From it every rank knows every rank's chunk, so halo senders and receivers
agree on what moves without any further handshake, and a wrong setup fails
with the same clear ValueError on every rank before any K/V moves (a check
that failed on one rank only would leave the others hanging in a collective).

Rules (checked here):

- every rank passes a chunk of the same length (split the sequence with
  :func:`plsh_dist.distributed.sp_chunks.sp_chunk`, which needs
  ``T % sp_size == 0``; uneven chunks are not supported: pad the packed
  sequence to a multiple of ``sp_size``);
- each rank's positions are contiguous (``first + arange(T_local)``), and the
  chunks follow each other in rank order (gaps between chunks are allowed);
- batch, heads, head dim, dtype, causal flag and hash are equal on all ranks.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from plsh_dist.distributed.comm_stats import record_meta

_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def dtype_code(dtype: torch.dtype) -> int:
    """Small int naming a float dtype (for the cross-rank signature)."""
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def hash_fingerprint(lsh) -> int:
    """CRC32 of the hash's pitches and shifts: equal iff ranks built the same masks."""
    data = lsh.pitch.numpy().tobytes() + lsh.shift.numpy().tobytes()
    return zlib.crc32(data)


@dataclass(frozen=True)
class GroupChunks:
    """The chunks of one SP group, identical on every rank.

    Attributes:
        group: the process group; rank: this rank's index in it; size: P.
        global_ranks: group index -> global rank (for point-to-point calls).
        firsts: first absolute position of each rank's chunk.
        length: T_local, tokens per chunk (equal on every rank).
    """

    group: object
    rank: int
    size: int
    global_ranks: tuple[int, ...]
    firsts: tuple[int, ...]
    length: int

    def start(self, r: int) -> int:
        return self.firsts[r]

    def end(self, r: int) -> int:
        """One past the last position of rank ``r``."""
        return self.firsts[r] + self.length

    @property
    def first(self) -> int:
        return self.firsts[self.rank]


def exchange_chunks(group, positions: torch.Tensor, signature: dict[str, int]) -> GroupChunks:
    """All-gather each rank's chunk and ``signature``; validate; return the chunks.

    Args:
        positions: this rank's CPU LongTensor[T_local], strictly increasing.
        signature: name -> int values that must agree on every rank.
    """
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    n = positions.numel()
    first, last = (int(positions[0]), int(positions[-1])) if n else (0, -1)
    names = list(signature)
    mine = torch.tensor([first, last, n, *[int(signature[k]) for k in names]], dtype=torch.int64)
    table = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(table, mine, group=group)
    record_meta(2 * (size - 1) * mine.numel() * mine.element_size())
    table = torch.stack(table)  # (P, 3 + len(signature))

    for col, name in enumerate(names, start=3):
        values = table[:, col].tolist()
        if len(set(values)) != 1:
            raise ValueError(
                f"sequence parallelism: '{name}' differs across the SP group's ranks: {values} "
                "(rank order); every rank must call the op with the same arguments and tensor shapes"
            )
    lengths = table[:, 2].tolist()
    if len(set(lengths)) != 1:
        raise ValueError(
            f"sequence parallelism: mismatched chunk lengths across ranks {lengths}; every rank must pass "
            "an equal contiguous chunk (split with plsh_dist.distributed.sp_chunks.sp_chunk, which needs "
            "T % sp_size == 0: pad the sequence to a multiple of sp_size)"
        )
    if lengths[0] < 1:
        raise ValueError("sequence parallelism: chunks must hold at least one token")
    firsts, lasts = table[:, 0].tolist(), table[:, 1].tolist()
    for r in range(size):
        if lasts[r] - firsts[r] + 1 != lengths[r]:
            raise ValueError(
                f"sequence parallelism: positions of rank {r} are not contiguous (first {firsts[r]}, last "
                f"{lasts[r]}, {lengths[r]} tokens); each rank needs first + arange(T_local), gaps only between chunks"
            )
        if r and firsts[r] <= lasts[r - 1]:
            raise ValueError(
                f"sequence parallelism: chunks are out of order: rank {r} starts at {firsts[r]} but rank {r - 1} "
                f"ends at {lasts[r - 1]}; rank r must hold the r-th contiguous chunk of the sequence"
            )
    global_ranks = tuple(dist.get_global_rank(group, r) for r in range(size))
    return GroupChunks(group, rank, size, global_ranks, tuple(firsts), lengths[0])
