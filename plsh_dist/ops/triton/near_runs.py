"""The near tiles' runs table: a hash's blocks as runs of tokens, merged over samples.

Beyond ``UNROLLED_SAMPLES`` samples the fused kernel counts a tile that meets its rows' blocks
as a product over the runs that hold them (:mod:`plsh_dist.ops.triton.kernels`,
``_count_blocks``), read from one :class:`NearBlocks` per kernel bias. :meth:`NearBlocks.of`
builds it, in one of two forms that give the same table where the kernels read it (the offsets,
and the runs they index):

- ``by="torch"``: torch ops with static shapes on the starts' device: the reference, what the
  planner's static model counts runs with, and what the launcher runs on CPU tensors (Triton's
  interpreter runs ``tl.sort`` too slowly for a test suite);
- ``by="kernels"``: one int32 buffer filled by four launches of
  :mod:`~plsh_dist.ops.triton.table_kernels`' kernels (CUDA tensors, or CPU ones under Triton's
  interpreter), nothing read back.

Legend: n tokens, s samples, Hh bias heads, a = ceil(n / NEAR_ANCHOR) anchors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.ops.triton.kernel_bias import MAX_NEAR_SAMPLES, NEAR_ANCHOR, padded_samples
from plsh_dist.ops.triton.runtime import table_kernels as launch
from plsh_dist.ops.triton.tile_bands import num_tiles

_SCAN_CHUNK = 1024
#: entries of one near_runs_kernel program's (tokens, samples) block: at most this, and at most NEAR_ANCHOR tokens
_RUN_LANES = 2048


@dataclass(frozen=True)
class NearBlocks:
    """The blocks of a call's hash as runs of tokens, what the kernels count a near tile from at large s
    (``NUM_SAMPLES > UNROLLED_SAMPLES``). A block is a run of tokens ``[first, end)`` with one block start,
    in one document; blocks of several samples with the same run merge into one run of that weight.
    Per head, two lists in one table:

    - the runs that open on each token, ordered by (first, end): ``offsets``;
    - at every anchor (tokens ``0, NEAR_ANCHOR, 2 NEAR_ANCHOR, ...``), the runs holding it:
      ``enter_offsets``.

    Attributes:
        offsets: int32 (Hh, n + 1), index of head hh's first run whose first token is >= i
            (``offsets[hh, n]``: the next head's first run).
        enter_offsets: int32 (Hh, anchors + 1), index of the first run holding each anchor (its
            last entry: the next head's).
        first, end: int32 [runs], the run's first token and one past its last.
        weight: float16 [runs], how many samples have that block (an integer <= 2048: exact).
    """

    offsets: torch.Tensor
    enter_offsets: torch.Tensor
    first: torch.Tensor
    end: torch.Tensor
    weight: torch.Tensor

    @classmethod
    def of(cls, starts: torch.Tensor, doc: torch.Tensor | None, *, by: str = "torch") -> "NearBlocks":
        """The runs of the kernels' block starts ``starts`` (int32 (Hh, s, n), contiguous:
        :meth:`~plsh_dist.ops.triton.tile_bands.CountReach.table`) and document ids ``doc`` (int32[n] or
        None), built ``by`` torch ops (:func:`_by_torch`) or the table kernels (:func:`_by_kernels`)."""
        forms = {"torch": _by_torch, "kernels": _by_kernels}
        if by not in forms:
            raise ValueError(f"a near runs table is built by 'torch' or 'kernels', got {by!r}")
        return forms[by](starts, doc)

    @property
    def args(self) -> tuple:
        return self.offsets, self.enter_offsets, self.first, self.end, self.weight


def run_slots(num_heads: int, num_samples: int, n: int) -> tuple[int, int]:
    """(opening, entering): the largest possible numbers of runs, the sizes of the table's two lists
    (``Hh s n`` runs opening on a token, ``Hh s a`` holding an anchor); ValueErrors where the kernels
    cannot take them."""
    if num_samples > MAX_NEAR_SAMPLES:
        raise ValueError(f"the Triton kernel counts at most {MAX_NEAR_SAMPLES} samples, got {num_samples}")
    opening, entering = num_heads * num_samples * n, num_heads * num_samples * -(-n // NEAR_ANCHOR)
    if opening + entering >= 2**31:
        raise ValueError(f"{opening + entering} run slots: the kernels index them in int32")
    return opening, entering


def _merge(keys: torch.Tensor, valid: torch.Tensor, big: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct ``keys`` where ``valid`` with how many times each occurs, sorted, in buffers of the input's
    size (static shapes: no host synchronisation): the unused tail holds ``big``, weight 0."""
    k = torch.where(valid, keys, big).flatten().sort().values
    first = torch.ones_like(k, dtype=torch.bool)
    first[1:] = k[1:] != k[:-1]
    first &= k != big
    rank = torch.cumsum(first, 0) - 1
    at = torch.where(first, rank, k.numel() - 1)  # the last slot is never a distinct key's (or it is big's)
    out = torch.full_like(k, big).scatter_(0, at, torch.where(first, k, big))
    weight = torch.zeros_like(k).index_add_(0, rank.clamp(min=0), (k != big).to(k.dtype))
    return out, weight


def _by_torch(starts: torch.Tensor, doc: torch.Tensor | None) -> NearBlocks:
    """The runs table by torch ops on the starts' device.

    A token opens a block of sample t where its start differs from the previous token's, or its
    document does (equal starts in one document are one block of the hash; only a first block can
    be clamped to int32). Device ops with static shapes, no host synchronisation: the runs lie in
    buffers of their largest possible number (``Hh s n`` opening, ``Hh s anchors`` holding an
    anchor), the unused tail never indexed by the offsets. About 98 torch ops and temporaries of
    ``Hh s n`` entries: the reference, not what the launcher runs."""
    Hh, s, n = starts.shape
    run_slots(Hh, s, n)
    device = starts.device
    na = -(-n // NEAR_ANCHOR)
    opens = torch.ones(Hh, s, n, dtype=torch.bool, device=device)
    opens[..., 1:] = starts[..., 1:] != starts[..., :-1]
    if doc is not None:
        opens[..., 1:] |= doc[1:] != doc[:-1]
    token = torch.arange(n, dtype=torch.int64, device=device)
    at = torch.where(opens, token, n)  # (Hh, s, n): the token where a block opens, n elsewhere
    after = torch.cat([at[..., 1:], torch.full((Hh, s, 1), n, dtype=at.dtype, device=device)], -1)
    end = after.flip(-1).cummin(-1).values.flip(-1)  # one past each token's block
    head = torch.arange(Hh, device=device)
    width = n + 1
    runs, weight = _merge((head.view(Hh, 1, 1) * n + token) * width + end, opens, Hh * n * width)
    offsets = torch.searchsorted(runs, (head.view(Hh, 1) * n + torch.arange(width, device=device)) * width)
    anchors = torch.arange(0, n, NEAR_ANCHOR, device=device)
    first = torch.where(opens, token, -1).cummax(-1).values[..., anchors]  # each anchor's block opens there
    key = ((head.view(Hh, 1, 1) * na + torch.arange(na, device=device)) * width + first) * width + end[..., anchors]
    big = Hh * na * width * width
    entering, enter_weight = _merge(key, torch.ones_like(key, dtype=torch.bool), big)
    enter_offsets = torch.searchsorted(entering, (head.view(Hh, 1) * na + torch.arange(na + 1, device=device))
                                       * width * width) + runs.numel()
    return NearBlocks(offsets.to(torch.int32), enter_offsets.to(torch.int32),
                      torch.cat([runs // width % n, entering // width % width]).to(torch.int32),
                      torch.cat([runs % width, entering % width]).to(torch.int32),
                      torch.cat([weight, enter_weight]).to(torch.float16))


def _by_kernels(starts: torch.Tensor, doc: torch.Tensor | None) -> NearBlocks:
    """The runs table by the table kernels on the starts' device: one int32 buffer, four launches,
    nothing read back. Equal to :func:`_by_torch`'s where the kernels read it (the offsets, and the
    runs they index).

    The launches: every sample's runs (``block_ends_kernel``: the end of the block opening on each
    token, the run holding each anchor), how many distinct runs open on each token and hold each
    anchor (``near_runs_kernel``), their running sums per head (``run_offsets_kernel``), then each
    run at its slot (``near_runs_kernel`` again, ``WRITE``). Memory: ``Hh s n`` int32 of ends besides
    the table's ``2.5 Hh s (n + a)`` words."""
    Hh, s, n = starts.shape
    opening, entering = run_slots(Hh, s, n)
    na = -(-n // NEAR_ANCHOR)
    runs = opening + entering
    sizes = [Hh * s * n, Hh * s * na, Hh * s * na, Hh * (n + 1), Hh * (na + 1), 2 * Hh, runs, runs, -(-runs // 2)]
    open_end, anchor_first, anchor_end, offsets, enter_offsets, totals, first, end, weight = \
        torch.empty(sum(sizes), dtype=torch.int32, device=starts.device).split(sizes)
    weight = weight.view(torch.float16)[:runs]
    has_docs = doc is not None
    doc = doc if has_docs else starts  # an int32 pointer, never read
    samples = padded_samples(s)
    tokens = max(1, min(NEAR_ANCHOR, _RUN_LANES // samples))
    heads = 1 << max(Hh - 1, 0).bit_length()
    mod = launch(starts.device)
    mod.block_ends_kernel[(s, Hh)](starts, doc, open_end, anchor_first, anchor_end, n, s, na, HAS_DOCS=has_docs,
                                   ANCHOR=NEAR_ANCHOR, CHUNK=min(_SCAN_CHUNK, 1 << max(n - 1, 15).bit_length()))
    counts = dict(TOKENS=tokens, SAMPLES=samples, HEADS=heads, ANCHOR=NEAR_ANCHOR)
    tables = (open_end, anchor_first, anchor_end, offsets, enter_offsets, totals, first, end, weight,
              n, s, Hh, na, opening)
    mod.near_runs_kernel[(num_tiles(n, tokens), Hh)](*tables, WRITE=False, **counts)
    mod.run_offsets_kernel[(2, Hh)](offsets, enter_offsets, totals, n, Hh, na, CHUNK=_SCAN_CHUNK)
    mod.near_runs_kernel[(num_tiles(n, tokens), Hh)](*tables, WRITE=True, **counts)
    return NearBlocks(offsets.view(Hh, n + 1), enter_offsets.view(Hh, na + 1), first, end, weight)
