"""The layout of the varlen (CUDA) block attention's calls: rows, cu_seqlens, chunks.

Each hash block becomes one varlen sequence; every batch row and, for per-head hashes, every head is
laid along the flat rows axis (shared hash: rows (b, i); per-head: rows (h, b, i), k/v repeated to
their query heads), so a sample is one launch, cut into several only past ``MAX_SEQS_PER_CALL``
blocks (CUDA's 65535 grid limit). The buckets are computed on the device; the block starts come
back in one device-to-host copy per forward (the op's one host sync). The row layouts and why:
docs/gpu.md, "The CUDA per-sample strategy".

Legend: s samples, B batch, n tokens, Hq query heads, H hash heads (1 or Hq), R rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from plsh_dist.hashing import PositionalLSH, block_starts
from plsh_dist.ops.documents import Documents

MAX_SEQS_PER_CALL = 65535


@dataclass(frozen=True)
class VarlenChunk:
    """One varlen call: rows [row_start, row_end) cut into blocks.

    Attributes:
        row_start, row_end: the call's slice of the rows axis (host ints).
        cu_seqlens: int32 (nseq + 1,) block offsets relative to ``row_start``,
            on the compute device.
        max_len: longest block of the call (host int).
    """

    row_start: int
    row_end: int
    cu_seqlens: torch.Tensor
    max_len: int


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    x = x.pin_memory() if device.type == "cuda" else x
    return x.to(device, non_blocking=True)


def _block_start_indices(lsh: PositionalLSH, positions: torch.Tensor, device: torch.device,
                         docs: Documents | None = None) -> np.ndarray:
    """Flat indices ``(t * H + h) * (n - 1) + (i - 1)`` of every i >= 1 that starts a
    block (documents cut blocks too), sorted; computed on ``device``, returned on the
    host (the one sync)."""
    buckets = lsh.buckets(_to_device(positions, device))  # (s, H, n) on device; same formula as on the CPU
    starts = block_starts(buckets)
    if docs is not None:
        starts |= _to_device(docs.start_mask, device)
    starts = starts[..., 1:].flatten()  # token 0 starts every (t, h): kept implicit
    return torch.nonzero(starts).flatten().to(torch.int64).cpu().numpy()


def _sample_rows(starts_by_head: list[np.ndarray], n: int, batch: int) -> np.ndarray:
    """Row of every block start of one sample, ordered (h, b, i), int64.

    starts_by_head[h]: sorted token indices where head h's blocks start (0 first).
    """
    counts = np.array([len(x) for x in starts_by_head], dtype=np.int64)
    head = np.repeat(np.arange(len(counts)), counts)
    starts = np.concatenate(starts_by_head)
    head_offset = np.repeat(np.cumsum(counts) - counts, counts)  # first entry of each start's head
    j = np.arange(starts.size) - head_offset  # index within its head
    first = head_offset * batch  # where head h's rows begin in the output
    rows = np.empty(starts.size * batch, dtype=np.int64)
    for b in range(batch):
        rows[first + b * counts[head] + j] = (head * batch + b) * n + starts
    return rows


def _chunks(rows: np.ndarray, total: int, device: torch.device, max_seqs: int) -> list[VarlenChunk]:
    cu = np.append(rows, total)
    lengths = np.diff(cu)
    chunks = []
    for first in range(0, lengths.size, max_seqs):
        last = min(first + max_seqs, lengths.size)
        row_start, row_end = int(cu[first]), int(cu[last])
        local = torch.from_numpy((cu[first : last + 1] - row_start).astype(np.int32))
        if device.type == "cuda":
            local = local.pin_memory().to(device, non_blocking=True)
        else:
            local = local.to(device)
        chunks.append(VarlenChunk(row_start, row_end, local, int(lengths[first:last].max())))
    return chunks


def varlen_calls(
    lsh: PositionalLSH,
    positions: torch.Tensor,
    batch: int,
    device: torch.device,
    max_seqs: int | None = None,
    docs: Documents | None = None,
) -> list[list[VarlenChunk]]:
    """The varlen calls of every sample: ``calls[t]`` is sample t's list of chunks.

    Args:
        lsh: the hash (1 head, or one per query head: rows then include heads).
        positions: CPU LongTensor[n], increasing.
        batch: B.
        device: where the calls run (and the buckets are computed).
        max_seqs: blocks per call (default ``MAX_SEQS_PER_CALL``; tests lower it).
        docs: documents of the (batch 1) row, whose starts cut blocks too.
    """
    max_seqs = max_seqs or MAX_SEQS_PER_CALL
    s, H, n = lsh.num_samples, lsh.num_heads, positions.numel()
    flat = _block_start_indices(lsh, positions, device, docs) if n > 1 else np.zeros(0, dtype=np.int64)
    seg = flat // max(n - 1, 1)  # t * H + h
    index = flat % max(n - 1, 1) + 1  # token index of the start
    bounds = np.searchsorted(seg, np.arange(s * H + 1))  # entries of (t, h) are [bounds[tH+h], bounds[tH+h+1])
    zero = np.zeros(1, dtype=np.int64)
    calls = []
    for t in range(s):
        per_head = [np.concatenate([zero, index[bounds[t * H + h] : bounds[t * H + h + 1]]]) for h in range(H)]
        calls.append(_chunks(_sample_rows(per_head, n, batch), H * batch * n, device, max_seqs))
    return calls
