"""Packed documents: which tokens may attend to which, as block boundaries.

Pretraining packs several documents into each row; a token must not attend
across a document boundary. For the block attentions this is free: every
sample's blocks are cut at the document boundaries as well, and the
estimator's expectation becomes document-masked ALiBi,

    E[M_ij] = exp(-|p_i - p_j| / sigma) * [doc(i) == doc(j)].

Public form (flash-attn's varlen convention): ``cu_seqlens``, an integer
tensor ``(num_docs + 1,)`` of document offsets over the *flattened*
``(B, T)`` batch: it starts at 0, ends at ``B * T``, increases strictly and
holds every row boundary ``b * T`` (documents never span rows). Rows may
have different layouts. transformers' other packed form, ``position_ids``
that restart at 0 per document, converts with :func:`cu_seqlens_from_position_ids`.

Positions keep their meaning: ALiBi's distance and the hash use the tokens'
own positions. With documents they need only increase *within* each
document, so they may restart at every document start (transformers'
packed rows); a document hashed at positions ``p`` gets exactly the blocks
it gets on its own at positions ``p``.

Internally a call with documents runs on one flat row of ``n = B * T``
tokens (batch 1), described by :class:`Documents`; its row boundaries are
document boundaries.

Legend: B batch, T tokens per row, n = B * T flat tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from plsh_dist.ops.input_checks import LAYOUT


@dataclass(frozen=True)
class Documents:
    """Documents of one flat row of ``n`` tokens with their positions.

    Attributes:
        ids: LongTensor[n], non-decreasing document index of every token (CPU).
        positions: LongTensor[n], the tokens' positions, strictly increasing
            within each document (CPU).
    """

    ids: torch.Tensor
    positions: torch.Tensor

    @functools.cached_property
    def start_mask(self) -> torch.Tensor:
        """BoolTensor[n]: True where a token starts a document (token 0 always)."""
        first = torch.ones(min(1, self.ids.numel()), dtype=torch.bool)
        return torch.cat([first, self.ids[1:] != self.ids[:-1]])

    @functools.cached_property
    def cu_seqlens(self) -> torch.Tensor:
        """LongTensor[num_docs + 1]: token offsets of the documents, ``[0, ..., n]``."""
        end = torch.tensor([self.ids.numel()])
        return torch.cat([torch.nonzero(self.start_mask).flatten(), end])

    @functools.cached_property
    def _index(self) -> torch.Tensor:
        """Index of every token's document in :attr:`cu_seqlens`, LongTensor[n]."""
        return torch.cumsum(self.start_mask.long(), 0) - 1

    @functools.cached_property
    def first(self) -> torch.Tensor:
        """LongTensor[n]: first token of every token's document."""
        return self.cu_seqlens[self._index]

    @functools.cached_property
    def end(self) -> torch.Tensor:
        """LongTensor[n]: one past the last token of every token's document."""
        return self.cu_seqlens[self._index + 1]

    @functools.cached_property
    def offset(self) -> torch.Tensor:
        """LongTensor[n]: a per-document shift that makes ``positions + offset`` strictly
        increasing over the whole row (0 while the positions already increase)."""
        gap = self.positions[1:] - self.positions[:-1]
        step = torch.where(self.start_mask[1:], (1 - gap).clamp(min=0), 0)
        return torch.cat([torch.zeros(min(1, gap.numel() + 1), dtype=torch.long), torch.cumsum(step, 0)])

    @functools.cached_property
    def virtual_positions(self) -> torch.Tensor:
        """LongTensor[n] strictly increasing; within a document, the positions plus a
        constant. Distances inside a document are the real ones; a token can find
        keys by position (``searchsorted``) across the whole row."""
        return self.positions + self.offset

    @classmethod
    def from_ids(cls, ids: torch.Tensor, positions: torch.Tensor) -> "Documents":
        """Documents of non-decreasing ``ids`` (LongTensor[n]); checks that ``positions``
        increase strictly within each document."""
        ids, positions = ids.to("cpu", torch.int64), positions.to("cpu", torch.int64)
        docs = cls(ids, positions)
        inside = ~docs.start_mask[1:]
        if bool((positions[1:] <= positions[:-1])[inside].any()):
            raise ValueError(
                "positions must increase strictly within each document (they may restart where a "
                "document starts); check position_ids / positions against cu_seqlens"
            )
        return docs

    @classmethod
    def from_cu_seqlens(cls, cu: torch.Tensor, positions: torch.Tensor) -> "Documents":
        """From checked offsets ``cu`` (LongTensor[num_docs + 1], see :func:`check_cu_seqlens`)."""
        lengths = cu[1:] - cu[:-1]
        return cls.from_ids(torch.repeat_interleave(torch.arange(lengths.numel()), lengths), positions)


def check_cu_seqlens(cu_seqlens, batch: int, seqlen: int) -> torch.Tensor:
    """Validate flash-attn style document offsets over a flattened (batch, seqlen) batch.

    Returns the offsets as a CPU LongTensor[num_docs + 1]. ValueErrors name
    ``cu_seqlens`` and the fix.
    """
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError("cu_seqlens must be an int32/int64 tensor of document offsets [0, ..., batch * seqlen]")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries [0, ..., batch * seqlen], "
                         f"got shape {tuple(cu_seqlens.shape)}")
    cu = cu_seqlens.to("cpu", torch.int64)
    total = batch * seqlen
    if int(cu[0]) != 0 or int(cu[-1]) != total:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at batch * seqlen = {batch} * {seqlen} = {total} (offsets over "
            f"the flattened batch), got first {int(cu[0])} and last {int(cu[-1])}. {LAYOUT}"
        )
    if bool((cu[1:] <= cu[:-1]).any()):
        bad = int(torch.nonzero(cu[1:] <= cu[:-1])[0])
        raise ValueError(f"cu_seqlens must increase strictly (no empty documents), but entry {bad + 1} "
                         f"({int(cu[bad + 1])}) follows {int(cu[bad])}")
    rows = torch.arange(1, batch) * seqlen
    missing = rows[~torch.isin(rows, cu)]
    if missing.numel():
        raise ValueError(
            f"cu_seqlens must contain every row boundary b * seqlen (documents cannot span batch rows of "
            f"seqlen={seqlen}); missing {missing[:4].tolist()}: end each row's last document at its row's end"
        )
    return cu


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """transformers' packed rows -> document offsets: a document starts at every
    ``position_ids == 0`` and at each row's first token.

    Args:
        position_ids: (B, T) integer positions, restarting at 0 per document.
    Returns:
        int32 (num_docs + 1,) offsets over the flattened batch.
    """
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be (B, T), got shape {tuple(position_ids.shape)}")
    B, T = position_ids.shape
    starts = position_ids.to("cpu") == 0
    starts[:, 0] = True
    flat = torch.nonzero(starts.flatten()).flatten()
    return torch.cat([flat, torch.tensor([B * T])]).to(torch.int32)


def flat_documents(positions, cu_seqlens, batch: int, seqlen: int) -> Documents:
    """Check ``positions`` (None, LongTensor[T] or (B, T)) and ``cu_seqlens`` of a
    (batch, seqlen) call and describe its flat row of ``batch * seqlen`` tokens."""
    cu = check_cu_seqlens(cu_seqlens, batch, seqlen)
    if positions is None:
        pos = torch.arange(seqlen).repeat(batch)
    else:
        if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64):
            raise ValueError("positions must be an integer LongTensor[seqlen] or (batch, seqlen)")
        if positions.dim() == 1:
            if positions.numel() != seqlen:
                raise ValueError(f"positions must be LongTensor[seqlen] with seqlen={seqlen}, "
                                 f"got shape {tuple(positions.shape)}")
            pos = positions.to("cpu", torch.int64).repeat(batch)
        elif positions.shape == (batch, seqlen):
            pos = positions.to("cpu", torch.int64).flatten()
        else:
            raise ValueError(f"positions must be LongTensor[seqlen] or (batch, seqlen) = ({batch}, {seqlen}), "
                             f"got shape {tuple(positions.shape)}")
        if pos.numel() and int(pos.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(pos.min())}")
    return Documents.from_cu_seqlens(cu, pos)


def flatten_rows(x_BTHD: torch.Tensor) -> torch.Tensor:
    """(B, T, H, D) -> (1, B * T, H, D): the flat row of a call with documents."""
    B, T = x_BTHD.shape[:2]
    return x_BTHD.reshape(1, B * T, *x_BTHD.shape[2:])


def unflatten_rows(x_1nHD: torch.Tensor, batch: int) -> torch.Tensor:
    """(1, B * T, H, D) -> (B, T, H, D)."""
    return x_1nHD.reshape(batch, -1, *x_1nHD.shape[2:])


def flatten_lse(lse_BHT: torch.Tensor) -> torch.Tensor:
    """(B, H, T) -> (1, H, B * T), the flat row's layout."""
    return lse_BHT.transpose(0, 1).reshape(1, lse_BHT.shape[1], -1)


def unflatten_lse(lse_1Hn: torch.Tensor, batch: int) -> torch.Tensor:
    """(1, H, B * T) -> (B, H, T)."""
    H = lse_1Hn.shape[1]
    return lse_1Hn.reshape(H, batch, -1).transpose(0, 1).contiguous()


@dataclass(frozen=True)
class BatchRows:
    """How a call's (B, T) rows meet a kernel: as they are, or (``flat``: packed documents) as one
    flat row of B * T tokens whose row boundaries are document boundaries. The one place a call with
    documents is flattened and its results put back (PLSH, ALiBi, SP). A call site reads
    ``out, lse = rows.outputs(*fn(*rows.inputs(q, k, v), ...))``: it calls the kernel itself, through
    no wrapper."""

    batch: int
    flat: bool

    @classmethod
    def of(cls, q_BTHD: torch.Tensor, flat: bool) -> BatchRows:
        return cls(q_BTHD.shape[0], bool(flat))

    def inputs(self, *x_BTHD: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, T, H, D) tensors -> (1, B * T, H, D) when flat, else as they are."""
        return tuple(flatten_rows(x) for x in x_BTHD) if self.flat else x_BTHD

    def lse_input(self, lse_BHT: torch.Tensor) -> torch.Tensor:
        """lse (B, Hq, T) -> (1, Hq, B * T) when flat."""
        return flatten_lse(lse_BHT) if self.flat else lse_BHT

    def output(self, x_1nHD: torch.Tensor) -> torch.Tensor:
        """A flat call's (1, B * T, H, D) tensor -> (B, T, H, D)."""
        return unflatten_rows(x_1nHD, self.batch) if self.flat else x_1nHD

    def outputs(self, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A flat call's out (1, B * T, Hq, D) and lse (1, Hq, B * T) -> (B, T, Hq, D) and (B, Hq, T)."""
        return (self.output(out), unflatten_lse(lse, self.batch) if self.flat else lse)

    def grads(self, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """A flat call's (dq, dk, dv), each (1, B * T, H, D) -> (B, T, H, D)."""
        return tuple(self.output(g) for g in grads)
