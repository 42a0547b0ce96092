"""A weighted mixture of sources on the one global stream: which source each position reads.

Training with ``[data].sources`` reads the same global stream of positions as one source does
(sampler.py: dealt to the DP ranks, the state one position). Positions are grouped in blocks of
:data:`BLOCK`; each block holds every source's quota (its share of the weights, apportioned by
largest remainder, so within any block the mix is the weights to 1/BLOCK), in an order shuffled
per block by (seed, block). Position ``p`` therefore reads source ``s = order(b)[o]`` at that
source's own position ``q = b * quota[s] + (s's slots before o in block b)`` (``b, o = divmod(p,
BLOCK)``), and ``q`` walks the source's own stream (its windows, epoch after epoch of its own
permutation). Everything is a pure function of (seed, weights, p): a run resumes at any step,
at any DP size, from the global position alone, and what each source has given so far (sequences,
epochs) is computed, not counted (:meth:`Mixture.consumed`).

Shape legend: S = number of sources, n = positions asked for.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from plsh_dist.data.sampler import ShardedSampler, epoch_permutation
from plsh_dist.splitmix import splitmix64_int

BLOCK = 1024
"""Positions per block: the weights hold exactly over every block of this many sequences."""

_ORDER_SALT = 0x6D6978  # "mix": the block orders' seed differs from every source's


def source_seed(seed: int, source: int) -> int:
    """The shuffling seed of source ``source``'s own stream (unrelated to the others')."""
    return splitmix64_int(splitmix64_int(seed) ^ (source + 1)) >> 1


def quotas(weights: Sequence[float], block: int = BLOCK) -> np.ndarray:
    """(S,) int64 slots of each source in a block of ``block``: ``block x weight / sum``, the
    remainder to the largest fractions (ties: the earlier source). ValueError naming the weight
    for a weight that is not positive and finite, or below one slot of a block."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"[data].sources weights must be positive numbers, got {list(weights)}")
    exact = w / w.sum() * block
    out = np.floor(exact).astype(np.int64)
    left = block - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:left]] += 1
    if np.any(out == 0):
        s = int(np.argmin(out))
        raise ValueError(f"[data].sources weight {weights[s]} is below 1/{block} of the total ({w.sum():g}): that "
                         f"source would get no sequence in a block of {block}; raise it, or leave the source out")
    return out


class Mixture:
    """Global stream positions -> (source, that source's own position) (module doc).

    Args:
        weights: (S,) positive weights, in the sources' order.
        seed: the data seed ([data].seed).
    """

    def __init__(self, weights: Sequence[float], seed: int, block: int = BLOCK):
        self.block, self.seed = block, seed
        self.quota = quotas(weights, block)
        self._cached: tuple[int, np.ndarray, np.ndarray] | None = None

    @property
    def num_sources(self) -> int:
        return len(self.quota)

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(order, rank): block ``b``'s source per slot, and each slot's count of earlier slots of its source."""
        if self._cached is None or self._cached[0] != b:
            slots = np.repeat(np.arange(self.num_sources, dtype=np.int64), self.quota)
            order = slots[epoch_permutation(self.block, self.seed ^ _ORDER_SALT, b)]
            rank = np.empty(self.block, dtype=np.int64)
            by_source = np.argsort(order, kind="stable")  # each source's slots, in slot order
            starts = np.concatenate([[0], np.cumsum(self.quota)[:-1]])
            rank[by_source] = np.arange(self.block) - np.repeat(starts, self.quota)
            self._cached = (b, order, rank)
        return self._cached[1], self._cached[2]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sources, local)``, each (n,) int64: the source each global position reads and the
        position in that source's own stream."""
        blocks, offsets = np.divmod(np.asarray(positions, dtype=np.int64), self.block)
        sources, local = np.empty_like(blocks), np.empty_like(blocks)
        for b in np.unique(blocks):
            where = blocks == b
            order, rank = self._block(int(b))
            sources[where] = order[offsets[where]]
            local[where] = b * self.quota[sources[where]] + rank[offsets[where]]
        return sources, local

    def consumed(self, position: int) -> np.ndarray:
        """(S,) sequences each source has given once the stream has reached ``position``."""
        b, o = divmod(int(position), self.block)
        order, _ = self._block(b)
        return b * self.quota + np.bincount(order[:o], minlength=self.num_sources)


class MixtureSampler(ShardedSampler):
    """A DP rank's reads of a mixture: the global positions dealt as :class:`ShardedSampler` deals
    them, each mapped to ``(source, window)`` (training only: endless, shuffled).

    Args:
        window_counts: (S,) windows in each source's token stream.
        weights: (S,) the sources' weights.
        dp_rank, dp_size, seed, start: as :class:`ShardedSampler`.
    """

    def __init__(self, window_counts: Sequence[int], weights: Sequence[float], dp_rank: int = 0, dp_size: int = 1,
                 seed: int = 0, start: int = 0):
        super().__init__(int(min(window_counts)) if len(window_counts) else 0, dp_rank, dp_size, seed, start=start)
        self.mixture = Mixture(weights, seed)
        if len(window_counts) != self.mixture.num_sources:
            raise ValueError(f"{len(window_counts)} sources but {self.mixture.num_sources} weights")
        self.sources = [ShardedSampler(int(n), seed=source_seed(seed, s)) for s, n in enumerate(window_counts)]

    def at(self, positions: np.ndarray) -> np.ndarray:
        """(n, 2) int64 ``(source, window)`` of the global ``positions``."""
        sources, local = self.mixture.locate(positions)
        windows = np.empty_like(local)
        for s in np.unique(sources):
            where = sources == s
            windows[where] = self.sources[int(s)].at(local[where])
        return np.stack([sources, windows], axis=1)

    def source_progress(self) -> list[dict]:
        """Per source, at this sampler's position: ``{"sequences": read so far, "epochs": as a fraction}``."""
        counts = self.mixture.consumed(self.position)
        return [{"sequences": int(c), "epochs": float(c) / src.num_items} for c, src in zip(counts, self.sources)]
