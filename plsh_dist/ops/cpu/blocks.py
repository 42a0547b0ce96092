"""Block grids: one (sample, head) hash -> a padded batch of contiguous blocks.

All full blocks of one (sample, head) have length floor(delta) or ceil(delta)
(only the first and last are cut by the range), so padding every block to the
longest wastes little and turns the varlen problem into one batched call.

Legend: n tokens (halo included under sequence parallelism), nb blocks,
L = longest block, slots = nb * L padded positions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from plsh_dist.hashing import block_starts, cu_seqlens_from_buckets


@dataclass(frozen=True)
class BlockGrid:
    """Where each token sits in the padded (nb, L) block grid.

    Attributes:
        cu_seqlens: int32 (nb + 1,) block offsets into the n tokens.
        max_len: L, the longest block.
        gather: int64 (nb * L,) token index of every slot (padding slots: 0).
        slot: int64 (n,) slot of every token (inverse of ``gather``).
        key_valid: bool (nb, L), True where a slot holds a real token.
    """

    cu_seqlens: torch.Tensor
    max_len: int
    gather: torch.Tensor
    slot: torch.Tensor
    key_valid: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def padded(self) -> bool:
        """True when some block is shorter than ``max_len``."""
        return self.gather.numel() != self.slot.numel()

    @classmethod
    def from_buckets(cls, buckets: torch.Tensor, device: torch.device | None = None,
                     doc_starts: torch.Tensor | None = None) -> "BlockGrid":
        """Bucket ids LongTensor[n] (on CPU, non-decreasing within each document) -> grid
        on ``device``. ``doc_starts``: BoolTensor[n], True where a document starts; blocks
        are cut there too (:mod:`plsh_dist.ops.documents`)."""
        n = buckets.numel()
        # the hash's own public boundaries, so the op runs exactly those blocks
        if doc_starts is None:
            cu = cu_seqlens_from_buckets(buckets).to(torch.int64)
        else:
            cu = torch.cat([torch.nonzero(block_starts(buckets) | doc_starts).flatten(), torch.tensor([n])])
        starts, lengths = cu[:-1], cu[1:] - cu[:-1]
        num_blocks = starts.numel()
        block_of_token = torch.repeat_interleave(torch.arange(num_blocks), lengths)
        max_len = int(lengths.max())
        slot = block_of_token * max_len + (torch.arange(n) - starts[block_of_token])
        key_valid = torch.arange(max_len)[None, :] < lengths[:, None]
        # Padding slots read token 0: any finite value will do, because padded
        # queries are discarded and get dout = 0 in backward, and padded keys
        # are masked (causal: they follow every real query of their block).
        gather = torch.zeros(num_blocks * max_len, dtype=torch.int64)
        gather[slot] = torch.arange(n)
        return cls(
            cu_seqlens=cu.to(torch.int32).to(device),
            max_len=max_len,
            gather=gather.to(device),
            slot=slot.to(device),
            key_valid=key_valid.to(device),
        )

    # -- moving tensors between token order and the block grid -------------

    def to_blocks(self, x_BTHD: torch.Tensor, zero_pads: bool = False) -> torch.Tensor:
        """(B, n, G, D) token order -> (B * nb, G, L, D) padded blocks.

        Padding slots hold an arbitrary real token unless ``zero_pads`` (needed
        for dout only: a padded query must not contribute to dk, dv).
        """
        B, n, G, D = x_BTHD.shape
        blocks = x_BTHD.index_select(1, self.gather).view(B, self.num_blocks, self.max_len, G, D)
        if zero_pads and self.padded:
            blocks = blocks.masked_fill(~self.key_valid[None, :, :, None, None], 0)
        return blocks.view(B * self.num_blocks, self.max_len, G, D).transpose(1, 2)

    def from_blocks(self, x_NGLD: torch.Tensor, batch: int) -> torch.Tensor:
        """(B * nb, G, L, D) padded blocks -> (B, n, G, D) token order."""
        _, G, L, D = x_NGLD.shape
        flat = x_NGLD.transpose(1, 2).reshape(batch, self.num_blocks * L, G, D)
        return flat.index_select(1, self.slot)

    def lse_to_blocks(self, lse_BGT: torch.Tensor) -> torch.Tensor:
        """(B, G, n) token order -> (B * nb, G, L) (padding slots: an arbitrary real row)."""
        B, G, n = lse_BGT.shape
        blocks = lse_BGT.index_select(2, self.gather).view(B, G, self.num_blocks, self.max_len)
        return blocks.transpose(1, 2).reshape(B * self.num_blocks, G, self.max_len)

    def lse_from_blocks(self, lse_NGL: torch.Tensor, batch: int) -> torch.Tensor:
        """(B * nb, G, L) -> (B, G, n) token order."""
        _, G, L = lse_NGL.shape
        flat = lse_NGL.view(batch, self.num_blocks, G, L).transpose(1, 2).reshape(batch, G, -1)
        return flat.index_select(2, self.slot)

    def pad_key_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive bias (nb, 1, 1, L) hiding padding keys, or None if unpadded.

        Causal attention never reaches the padding (it sits after every real
        query of its block), so only non-causal calls need it.
        """
        if not self.padded:
            return None
        bias = torch.zeros(self.key_valid.shape, dtype=dtype, device=self.key_valid.device)
        return bias.masked_fill(~self.key_valid, float("-inf"))[:, None, None, :]


#: A grid whose padding exceeds this fraction of its tokens is split into length classes.
_MAX_PADDING = 0.10
#: Length classes: blocks of length in (L / 2^(c+1), L / 2^c] share grid c; the last takes the rest.
_NUM_CLASSES = 4


@dataclass(frozen=True)
class GroupedGrids:
    """Blocks grouped by length: ``parts[c] = (grid, tokens)``, where ``tokens``
    (LongTensor on the device) lists, in order, the tokens of the blocks of class c and
    ``grid`` is their :class:`BlockGrid`: its ``gather`` reads the whole sequence's
    tokens directly, its ``slot`` and ``from_blocks`` give the part's tokens in the order
    of ``tokens``. Every token is in exactly one part.

    Documents cut blocks into pieces of any length; padding every piece to the longest
    block would spend the grid on padding, so pieces of similar length share one grid
    (each at most 2x padded, the last class aside)."""

    parts: tuple[tuple[BlockGrid, torch.Tensor], ...]


def block_grid(buckets: torch.Tensor, device: torch.device | None = None,
                 doc_starts: torch.Tensor | None = None) -> BlockGrid | GroupedGrids:
    """The padded grid of one (sample, head): :meth:`BlockGrid.from_buckets`, grouped by
    block length when documents are given and a single grid would pad more than 10%.

    Without documents the blocks are all floor/ceil(delta) long but the first and last,
    so one grid is kept (and the numbers stay those of the single grid)."""
    grid = BlockGrid.from_buckets(buckets, device, doc_starts)
    n = buckets.numel()
    if doc_starts is None or grid.num_blocks * grid.max_len <= (1 + _MAX_PADDING) * n:
        return grid
    cu = grid.cu_seqlens.to("cpu", torch.int64)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    ratio = torch.div(grid.max_len, lengths, rounding_mode="floor").clamp(min=1)
    klass = torch.floor(torch.log2(ratio.double())).long().clamp(max=_NUM_CLASSES - 1)
    parts = []
    for c in range(_NUM_CLASSES):
        chosen = torch.nonzero(klass == c).flatten()
        if not chosen.numel():
            continue
        lens = lengths[chosen]
        # token index of every member of the chosen blocks, in order
        tokens = torch.repeat_interleave(starts[chosen] - torch.cumsum(lens, 0) + lens, lens) + torch.arange(int(lens.sum()))
        ids = torch.repeat_interleave(torch.arange(chosen.numel()), lens)
        part = BlockGrid.from_buckets(ids, device)
        tokens = tokens.to(device)
        parts.append((replace(part, gather=tokens[part.gather]), tokens))  # gathers straight from the sequence
    return GroupedGrids(tuple(parts))
