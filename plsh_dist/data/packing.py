"""Packing a token stream into training windows, and cutting them for SP ranks.

Shape legend: N = tokens in the stream, T = seq_len, B = batch size,
P = sp_size, T_local = T / P.

Window ``i`` is ``tokens[i*T : i*T + T + 1]`` (T + 1 tokens; consecutive
windows share one token), so every token of the stream is an input exactly
once and a label exactly once (except the first, never a label, and the tail
of fewer than T tokens, dropped). Documents run across window borders, each
followed by EOS; attention is not reset at EOS (plain packing).

Labels are shifted on the whole window first (``labels = window[1:]``) and
only then cut into SP chunks. Cutting first and shifting each chunk would
lose the label of every chunk's last token (it lives on the next rank).
``position_ids`` are the window's global positions, so each SP rank hashes the
same absolute positions the unsplit sequence would. Which chunk a rank holds
(and the divisibility rule) is ``plsh_dist.distributed.sp_chunks``'s.
"""

from __future__ import annotations

import numpy as np
import torch

from plsh_dist.distributed.sp_chunks import sp_bounds

__all__ = ["num_windows", "gather_windows", "split_for_sp"]


def num_windows(num_tokens: int, seq_len: int) -> int:
    """Full windows of ``seq_len + 1`` tokens (stride ``seq_len``) in a stream of ``num_tokens``."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return max(0, (num_tokens - 1) // seq_len)


def gather_windows(tokens: np.ndarray, indices: np.ndarray, seq_len: int) -> np.ndarray:
    """Windows ``indices`` of the stream: int64 array (B, T + 1)."""
    indices = np.asarray(indices, dtype=np.int64)
    out = np.empty((len(indices), seq_len + 1), dtype=np.int64)
    for row, i in enumerate(indices):
        out[row] = tokens[i * seq_len : i * seq_len + seq_len + 1]
    return out


def split_for_sp(windows: np.ndarray | torch.Tensor, sp_rank: int = 0, sp_size: int = 1) -> dict[str, torch.Tensor]:
    """Shift globally, then take SP rank ``sp_rank``'s contiguous chunk.

    Args:
        windows: (B, T + 1) token ids.
    Returns:
        dict of int64 tensors, each (B, T_local), for positions
        ``[sp_rank * T_local, (sp_rank + 1) * T_local)`` of the sequence:
        ``input_ids`` = window[:, :-1], ``labels`` = window[:, 1:],
        ``position_ids`` = global positions (same row for every b).
    """
    w = torch.as_tensor(np.asarray(windows), dtype=torch.long)
    if w.ndim != 2 or w.shape[1] < 2:
        raise ValueError(f"windows must be (B, T + 1) with T >= 1, got shape {tuple(w.shape)}")
    seq_len = w.shape[1] - 1
    lo, hi = sp_bounds(seq_len, sp_rank, sp_size)  # checks the rank and divisibility
    inputs, labels = w[:, :-1], w[:, 1:]  # (B, T) each: the shift happens before the SP cut
    positions = torch.arange(seq_len, dtype=torch.long).expand(w.shape[0], seq_len)
    return {
        "input_ids": inputs[:, lo:hi].contiguous(),  # (B, T_local)
        "labels": labels[:, lo:hi].contiguous(),  # (B, T_local)
        "position_ids": positions[:, lo:hi].contiguous(),  # (B, T_local), global positions
    }
