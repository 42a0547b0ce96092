"""Which windows a data-parallel rank reads, in which order, from any resume point.

Epoch ``e`` orders all windows by a counter-based hash of (seed, e, index)
(SplitMix64; the same on every rank, machine and numpy version, no RNG
state to save). The first ``dp_size * per_rank`` windows of that order are
dealt round-robin: rank ``r`` takes positions ``r, r + dp_size, ...``; the
``num_windows % dp_size`` left over differ from epoch to epoch. So ranks are
disjoint within an epoch and each reads exactly ``per_rank`` windows.

The only state is ``consumed``, the number of windows this rank has read
(= global sequences / dp_size): epoch = consumed // per_rank, offset =
consumed % per_rank. A resumed run continues exactly where it stopped.
SP ranks of one group use the same dp_rank, hence read the same windows.
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
        num_items: windows in the dataset.
        dp_rank, dp_size: this rank and the data-parallel world size.
        seed: shuffling seed (same on every rank).
        shuffle: False keeps dataset order (evaluation).
        loop: True repeats epochs forever; False stops after one epoch.
        consumed: windows this rank already read (resume point).
    """

    def __init__(self, num_items: int, dp_rank: int = 0, dp_size: int = 1, seed: int = 0,
                 shuffle: bool = True, loop: bool = True, consumed: int = 0):
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
        if num_items < dp_size:
            raise ValueError(
                f"only {num_items} sequences for dp_size={dp_size} ranks: every rank needs at least one; "
                "use more data, a shorter seq_len or fewer data-parallel ranks"
            )
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        self.num_items, self.dp_rank, self.dp_size = num_items, dp_rank, dp_size
        self.seed, self.shuffle, self.loop = seed, shuffle, loop
        self.per_rank = num_items // dp_size
        self.consumed = consumed
        self._cached_epoch, self._cached_order = -1, np.empty(0, dtype=np.int64)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """(per_rank,) window indices this rank reads in ``epoch``, in order."""
        if epoch != self._cached_epoch:
            order = epoch_permutation(self.num_items, self.seed, epoch) if self.shuffle else np.arange(self.num_items)
            self._cached_order = order[: self.per_rank * self.dp_size][self.dp_rank :: self.dp_size]
            self._cached_epoch = epoch
        return self._cached_order

    def take(self, n: int) -> np.ndarray:
        """The next (up to) ``n`` indices; advances ``consumed``. Empty when a one-epoch sampler is done."""
        out = []
        while len(out) < n:
            epoch, offset = divmod(self.consumed, self.per_rank)
            if epoch >= 1 and not self.loop:
                break
            chunk = self.epoch_indices(epoch)[offset : offset + n - len(out)]
            out.extend(chunk.tolist())
            self.consumed += len(chunk)
        return np.asarray(out, dtype=np.int64)

    def __iter__(self) -> Iterator[int]:
        while True:
            idx = self.take(1)
            if len(idx) == 0:
                return
            yield int(idx[0])

    @property
    def epoch(self) -> int:
        return self.consumed // self.per_rank

    def state_dict(self) -> dict:
        return {"consumed": self.consumed, "seed": self.seed, "num_items": self.num_items, "dp_size": self.dp_size}

    def load_state_dict(self, state: dict) -> None:
        """Resume; ValueError if the data, seed or DP layout changed (the order would differ)."""
        for name in ("seed", "num_items", "dp_size"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"sampler state has {name}={state[name]} but this run has {name}={getattr(self, name)}; "
                    "resuming would replay a different order"
                )
        self.consumed = int(state["consumed"])
