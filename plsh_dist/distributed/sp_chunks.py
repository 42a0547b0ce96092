"""Which tokens a sequence-parallel rank holds: the one chunking rule.

A sequence of ``T`` tokens is cut into ``sp_size`` equal contiguous chunks;
rank ``r`` holds tokens ``[r * T / sp_size, (r + 1) * T / sp_size)`` with
their *global* positions. Training's data pipeline, evaluation and the tests
all cut here, and the divisibility rule (and its message) lives only here.
Uneven chunks are not supported: pad or pack to a multiple of ``sp_size``.
"""

from __future__ import annotations

import torch


def check_sp_divisible(seq_len: int, sp_size: int, name: str = "[data].seq_len") -> None:
    """ValueError unless ``sp_size`` divides ``seq_len``; ``name`` is the length's
    config field (or argument) as the message should name it."""
    if seq_len % sp_size:
        lower, upper = seq_len - seq_len % sp_size, seq_len + sp_size - seq_len % sp_size
        raise ValueError(
            f"{name}={seq_len} is not divisible by [parallel].sp_size={sp_size}; "
            f"each SP rank trains on seq_len / sp_size tokens: pick seq_len a multiple of {sp_size} "
            f"(e.g. {lower or upper} or {upper})"
        )


def sp_bounds(seq_len: int, sp_rank: int, sp_size: int, name: str = "[data].seq_len") -> tuple[int, int]:
    """Token range ``[lo, hi)`` of rank ``sp_rank``'s chunk; checks rank and divisibility."""
    if sp_size < 1 or not 0 <= sp_rank < sp_size:
        raise ValueError(f"need 0 <= sp_rank < sp_size, got sp_rank={sp_rank}, sp_size={sp_size}")
    check_sp_divisible(seq_len, sp_size, name)
    chunk = seq_len // sp_size
    return sp_rank * chunk, (sp_rank + 1) * chunk


def sp_chunk(x: torch.Tensor, sp_rank: int, sp_size: int, dim: int = 1) -> torch.Tensor:
    """Rank ``sp_rank``'s contiguous chunk of ``x`` along ``dim`` (a view)."""
    lo, hi = sp_bounds(x.shape[dim], sp_rank, sp_size, name="sequence length")
    return x.narrow(dim, lo, hi - lo)


def sp_positions(seqlen: int, sp_rank: int, sp_size: int, offset: int = 0) -> torch.Tensor:
    """Global positions LongTensor[seqlen // sp_size] of rank ``sp_rank``'s chunk."""
    lo, hi = sp_bounds(seqlen, sp_rank, sp_size, name="sequence length")
    return torch.arange(lo, hi, dtype=torch.int64) + offset
