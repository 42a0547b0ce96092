"""Which windows a data-parallel rank reads, in which order, from any resume point.

Training reads one **global stream**: epoch ``e`` orders all ``N`` windows by a counter-based hash
of (seed, e, index) (SplitMix64; the same on every rank, machine and numpy version, no RNG state
to save), and the epochs follow one another, so stream position ``p`` is window
``order(p // N)[p % N]``. The stream does not depend on the number of data-parallel ranks: each
global micro-batch of ``B x dp_size`` sequences is the next ``B x dp_size`` positions, dealt
round-robin, so rank ``r``'s ``i``-th read after a start at position ``p0`` is position
``p0 + dp_size * i + r``. The only state is the global position, ``start + dp_size * consumed``
once every rank has read ``consumed`` windows: a run resumed at another DP size (another world
size, or the same world with another SP size) continues at that position, no window read twice
or skipped (``DataPipeline.global_position``, saved in the trainer state).

A one-epoch pass (evaluation, ``loop=False``) reads the first ``dp_size * (N // dp_size)``
positions of epoch 0, so every rank reads exactly ``N // dp_size`` windows; the ``N % dp_size``
left over are not read. SP ranks of one group use the same dp_rank, hence read the same windows.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from plsh_dist.splitmix import MASK64, splitmix64

def epoch_permutation(num_items: int, seed: int, epoch: int) -> np.ndarray:
    """Permutation of ``range(num_items)`` (int64), a pure function of (seed, epoch)."""
    with np.errstate(over="ignore"):
        base = splitmix64(np.array([seed & MASK64], dtype=np.uint64) ^ splitmix64(
            np.array([epoch & MASK64], dtype=np.uint64)))
        keys = splitmix64(np.arange(num_items, dtype=np.uint64) + base[0])
    # Stable sort: ties (astronomically unlikely) still break the same way everywhere.
    return np.argsort(keys, kind="stable").astype(np.int64)


class ShardedSampler:
    """Endless (or one-epoch) stream of window indices for one DP rank.

    Args:
        num_items: windows in the dataset (N).
        dp_rank, dp_size: this rank and the data-parallel world size.
        seed: shuffling seed (same on every rank).
        shuffle: False keeps dataset order (evaluation).
        loop: True reads the global stream forever; False stops after one epoch.
        start: global stream position of this sampler's first read: the windows every DP rank
            together read before it (the resume point, independent of ``dp_size``).
    """

    def __init__(self, num_items: int, dp_rank: int = 0, dp_size: int = 1, seed: int = 0,
                 shuffle: bool = True, loop: bool = True, start: int = 0):
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
        if num_items < dp_size:
            raise ValueError(
                f"only {num_items} sequences for dp_size={dp_size} ranks: every rank needs at least one; "
                "use more data, a shorter seq_len or fewer data-parallel ranks"
            )
        if start < 0 or (start and not loop):
            raise ValueError(f"start must be >= 0, and 0 for a one-epoch sampler; got {start}")
        self.num_items, self.dp_rank, self.dp_size = num_items, dp_rank, dp_size
        self.seed, self.shuffle, self.loop = seed, shuffle, loop
        self.per_rank = num_items // dp_size
        """Windows this rank reads in a one-epoch pass."""
        self.start = start
        self.consumed = 0
        """Windows this rank has read since ``start``."""
        self._cached_epoch, self._cached_order = -1, np.empty(0, dtype=np.int64)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._cached_epoch:
            self._cached_order = (epoch_permutation(self.num_items, self.seed, epoch) if self.shuffle
                                  else np.arange(self.num_items, dtype=np.int64))
            self._cached_epoch = epoch
        return self._cached_order

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The windows at global stream ``positions`` (int64 array, any order)."""
        epochs, offsets = np.divmod(np.asarray(positions, dtype=np.int64), self.num_items)
        out = np.empty(len(offsets), dtype=np.int64)
        for epoch in np.unique(epochs):
            where = epochs == epoch
            out[where] = self._order(int(epoch))[offsets[where]]
        return out

    def take(self, n: int) -> np.ndarray:
        """The next (up to) ``n`` indices; advances ``consumed``. Empty when a one-epoch sampler is done."""
        if not self.loop:
            n = max(0, min(n, self.per_rank - self.consumed))
        reads = self.consumed + np.arange(n, dtype=np.int64)
        self.consumed += n
        return self.at(self.start + self.dp_size * reads + self.dp_rank)

    def __iter__(self) -> Iterator[int]:
        while True:
            idx = self.take(1)
            if len(idx) == 0:
                return
            yield int(idx[0])

    @property
    def position(self) -> int:
        """The global stream position after this rank's reads (the whole DP group's, once every
        rank has read as many windows): where a resumed run starts, at any DP size."""
        return self.start + self.dp_size * self.consumed

    @property
    def epoch(self) -> int:
        """The epoch the next global position falls in."""
        return self.position // self.num_items

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "num_items": self.num_items}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state["position"]`` (any DP size); ValueError if the data or the seed changed
        (the stream would be another)."""
        for name in ("seed", "num_items"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"sampler state has {name}={state[name]} but this run has {name}={getattr(self, name)}; "
                    "resuming would replay a different order"
                )
        self.start, self.consumed = int(state["position"]), 0
