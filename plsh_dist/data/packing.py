"""Packing a token stream into training windows, and cutting them for SP ranks.

Shape legend: N = tokens in the stream, T = seq_len, B = batch size,
P = sp_size, T_local = T / P.

Window ``i`` is ``tokens[i*T : i*T + T + 1]`` (T + 1 tokens; consecutive
windows share one token), so every token of the stream is an input exactly
once and a label exactly once (except the first, never a label, and the tail
of fewer than T tokens, dropped). Documents run across window borders, each
followed by EOS.

Document layout (``[data].document_masking``): a document is its tokens and
the EOS that ends it, so a new one starts at the input after each EOS and at
position 0 of every window (a document cut by a window border continues as a
new one). ``cu_seqlens`` lists those starts over the flattened (B, T) inputs,
then B * T: int32, strictly increasing, every row border b * T included
(flash-attn's varlen convention). It is computed from the whole window, so
every SP rank of a group gets the identical tensor. Labels do not change: a
document's last content token still predicts its EOS, and the EOS predicts
the next document's first token.

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


def document_cu_seqlens(inputs: np.ndarray, eos_id: int) -> torch.Tensor:
    """Document offsets of the flattened (B, T) ``inputs``: int32 tensor (num_docs + 1,).

    A document starts at position 0 of every row and after every EOS that is
    not a row's last input (that one ends its document inside the row; the
    next starts in the labels). ``[0, ..., B * T]``, strictly increasing, with
    every row border ``b * T``.
    """
    inputs = np.asarray(inputs)
    if inputs.ndim != 2 or inputs.shape[1] < 1:
        raise ValueError(f"inputs must be (B, T) with T >= 1, got shape {inputs.shape}")
    b, t = inputs.shape
    if b * t >= 2**31:
        raise ValueError(f"a batch of {b} x {t} = {b * t:,} tokens overflows int32 cu_seqlens; "
                         "lower [data].micro_batch_size or [data].seq_len")
    starts = np.empty((b, t), dtype=bool)
    starts[:, 0] = True
    np.equal(inputs[:, :-1], eos_id, out=starts[:, 1:])
    cu = np.empty(int(starts.sum()) + 1, dtype=np.int32)
    cu[:-1] = np.flatnonzero(starts)
    cu[-1] = b * t
    return torch.from_numpy(cu)


def max_document_length(cu_seqlens: torch.Tensor) -> int:
    """The longest document of a ``cu_seqlens`` layout (varlen attention's ``max_length``)."""
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def split_for_sp(windows: np.ndarray | torch.Tensor, sp_rank: int = 0, sp_size: int = 1, *,
                 eos_id: int | None = None) -> dict[str, torch.Tensor]:
    """Shift globally, then take SP rank ``sp_rank``'s contiguous chunk.

    Args:
        windows: (B, T + 1) token ids.
        eos_id: given = also return the document layout (``cu_seqlens``)
            with this end-of-document id; None = plain packing.
    Returns:
        dict of int64 tensors, each (B, T_local), for positions
        ``[sp_rank * T_local, (sp_rank + 1) * T_local)`` of the sequence:
        ``input_ids`` = window[:, :-1], ``labels`` = window[:, 1:],
        ``position_ids`` = global positions (same row for every b); with
        ``eos_id``, ``cu_seqlens``: ``document_cu_seqlens`` of the whole
        (B, T) inputs (not the chunk), the same on every SP rank.
    """
    arr = np.asarray(windows)
    w = torch.as_tensor(arr, dtype=torch.long)
    if w.ndim != 2 or w.shape[1] < 2:
        raise ValueError(f"windows must be (B, T + 1) with T >= 1, got shape {tuple(w.shape)}")
    seq_len = w.shape[1] - 1
    lo, hi = sp_bounds(seq_len, sp_rank, sp_size)  # checks the rank and divisibility
    inputs, labels = w[:, :-1], w[:, 1:]  # (B, T) each: the shift happens before the SP cut
    positions = torch.arange(seq_len, dtype=torch.long).expand(w.shape[0], seq_len)
    out = {
        "input_ids": inputs[:, lo:hi].contiguous(),  # (B, T_local)
        "labels": labels[:, lo:hi].contiguous(),  # (B, T_local)
        "position_ids": positions[:, lo:hi].contiguous(),  # (B, T_local), global positions
    }
    if eos_id is not None:
        out["cu_seqlens"] = document_cu_seqlens(arr[:, :-1], eos_id)  # (num_docs + 1,), whole batch
    return out
