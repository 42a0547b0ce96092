"""Packed documents under sequence parallelism: the whole sequence's layout, seen by position.

Every rank passes the same ``cu_seqlens``: document offsets over the
flattened *whole* ``(B, P * T)`` batch (flash-attn's convention, as the
single-process ops take it), checked equal across ranks by the call's
signature. Global token ``g`` of a row lives on rank ``g // T`` at position
``firsts[g // T] + g % T``, so each row's document starts become positions,
and the document of any token the rank handles (its chunk, a halo, the
all-gathered keys) is found by position alone: a chunk's documents are the
slice of the whole sequence's, the sub-range invariant the hash already has.

A halo then never needs keys of an earlier document: the block (or window)
of the chunk's first token starts no earlier than that token's document
(:func:`plsh_dist.distributed.halo.plsh_needs`, ``window_needs``).

Legend: B batch, T local tokens, P ranks, n tokens of one call's sequence.
"""

from __future__ import annotations

import zlib

import torch

from plsh_dist.distributed.group_chunks import GroupChunks
from plsh_dist.ops.alibi import alibi_backward, alibi_forward
from plsh_dist.ops.documents import BatchRows, Documents, check_cu_seqlens

#: Document ids of row b start at b * _ROW_IDS: ids never collide across rows.
_ROW_IDS = 1 << 40


def documents_crc(cu_seqlens: torch.Tensor | None) -> int:
    """CRC32 of the offsets (int64 bytes), 0 without documents: equal iff ranks agree."""
    if cu_seqlens is None:
        return 0
    return zlib.crc32(cu_seqlens.to("cpu", torch.int64).numpy().tobytes()) | 1


class SPDocuments:
    """Document starts of every row, as positions.

    Attributes:
        row_starts: list of B sorted LongTensors, the positions where row b's documents start.
        stride: a position offset per row that keeps flattened rows increasing.
    """

    def __init__(self, row_starts: list[torch.Tensor], stride: int):
        self.row_starts = row_starts
        self.stride = stride

    @classmethod
    def build(cls, cu_seqlens, chunks: GroupChunks, batch: int) -> "SPDocuments":
        """From the whole sequence's offsets and the call's chunks (checked: names ``cu_seqlens``)."""
        T, P = chunks.length, chunks.size
        cu = check_cu_seqlens(cu_seqlens, batch, P * T)
        firsts = torch.tensor(chunks.firsts)
        rows = []
        for b in range(batch):
            g = cu[(cu >= b * P * T) & (cu < (b + 1) * P * T)] - b * P * T  # row-local global tokens
            rows.append(firsts[g // T] + g % T)
        return cls(rows, chunks.end(P - 1) + 1)

    def bounds(self, row: int, firsts: torch.Tensor, lasts: torch.Tensor) -> tuple[list[int], list[int | None]]:
        """For each (first, last) position pair of ``row`` (LongTensors [P]): the first position
        of ``first``'s document, and of the document after ``last``'s (None: ``last`` is in the
        row's last document). One search for all ranks."""
        starts = self.row_starts[row]
        begin = starts[torch.searchsorted(starts, firsts, right=True) - 1].tolist()
        after = torch.searchsorted(starts, lasts, right=True)
        nxt = starts[after.clamp(max=starts.numel() - 1)].tolist()
        return begin, [n if a < starts.numel() else None for n, a in zip(nxt, after.tolist())]

    def ids(self, positions: torch.Tensor) -> torch.Tensor:
        """Document id of every (row, position), flattened row-major: LongTensor[B * n]
        (non-decreasing; rows never share an id)."""
        return torch.cat([
            b * _ROW_IDS + torch.searchsorted(starts, positions, right=True) - 1
            for b, starts in enumerate(self.row_starts)
        ])

    def flat(self, positions: torch.Tensor) -> Documents:
        """The :class:`Documents` of the flattened (B, n) call at increasing ``positions`` (LongTensor[n])."""
        return Documents.from_ids(self.ids(positions), positions.repeat(len(self.row_starts)))

    def virtual(self, positions: torch.Tensor) -> torch.Tensor:
        """Flattened positions kept increasing across rows, LongTensor[B * n]: queries and keys
        of one row keep their real distances (exact ALiBi's key ranges search them)."""
        return torch.cat([positions + b * self.stride for b in range(len(self.row_starts))])


def _alibi_flat(docs: SPDocuments, q_pos: torch.Tensor, k_pos: torch.Tensor):
    """Exact ALiBi's positions and documents of flattened rows: (vq, vk, (q_doc, k_doc))."""
    return docs.virtual(q_pos), docs.virtual(k_pos), (docs.ids(q_pos), docs.ids(k_pos))


def alibi_rows_forward(q, k, v, q_pos, k_pos, slopes, docs: SPDocuments | None, **kw):
    """:func:`~plsh_dist.ops.alibi.alibi_forward` of (B, Tq) queries against (B, Tk) keys at
    increasing positions; with documents, on the flattened rows (a query sees its own
    document's keys only)."""
    if docs is None:
        return alibi_forward(q, k, v, q_pos, k_pos, slopes, **kw)
    vq, vk, ids = _alibi_flat(docs, q_pos, k_pos)
    rows = BatchRows.of(q, flat=True)
    return rows.outputs(*alibi_forward(*rows.inputs(q, k, v), vq, vk, slopes, docs=ids, **kw))


def alibi_rows_backward(dout, q, k, v, out, lse, q_pos, k_pos, slopes, docs: SPDocuments | None, **kw):
    """Gradients of :func:`alibi_rows_forward`; lse (B, Hq, Tq)."""
    if docs is None:
        return alibi_backward(dout, q, k, v, out, lse, q_pos, k_pos, slopes, **kw)
    vq, vk, ids = _alibi_flat(docs, q_pos, k_pos)
    rows = BatchRows.of(q, flat=True)
    return rows.grads(alibi_backward(*rows.inputs(dout, q, k, v, out), rows.lse_input(lse), vq, vk, slopes, docs=ids,
                                     **kw))
