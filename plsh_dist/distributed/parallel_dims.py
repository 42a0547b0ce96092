"""Parallel layout: sequence-parallel (SP) x data-parallel (DP) process groups.

Rank layout (torchtitan style, SP innermost so one SP group sits on
consecutive ranks, i.e. on one node when nodes hold consecutive ranks):

    rank = dp_rank * sp_size + sp_rank

    world 4, sp 2:  SP groups [0, 1] [2, 3]     DP groups [0, 2] [1, 3]

Every rank of an SP group trains on the same packed sequence (its own
contiguous chunk); every DP group holds one rank per SP position and sees
different sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


def default_backend(device: torch.device | str) -> str:
    """Collective backend for a device: nccl on CUDA, gloo otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


@dataclass
class ParallelDims:
    """Sizes of the parallel dimensions, validated against the world size.

    Attributes:
        world_size: number of processes in the job.
        sp_size: ranks that share one sequence (sequence parallelism); 1 = off.
        dp_size: derived, ``world_size // sp_size``.
    """

    world_size: int
    sp_size: int = 1
    dp_size: int = field(init=False)

    def __post_init__(self) -> None:
        for name in ("world_size", "sp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ParallelDims.{name} must be a positive int, got {value!r}")
        if self.world_size % self.sp_size != 0:
            raise ValueError(
                f"ParallelDims: sp_size={self.sp_size} does not divide world_size={self.world_size} "
                f"(world_size = dp_size x sp_size must hold exactly); set parallel.sp_size to a divisor "
                f"of {self.world_size} or launch a multiple of {self.sp_size} processes"
            )
        self.dp_size = self.world_size // self.sp_size

    # -- rank arithmetic (pure, no process group needed) -------------------
    def sp_rank(self, rank: int) -> int:
        """Position of ``rank`` inside its SP group (which chunk it trains on)."""
        self._check_rank(rank)
        return rank % self.sp_size

    def dp_rank(self, rank: int) -> int:
        """Index of ``rank``'s SP group, i.e. which data shard it reads."""
        self._check_rank(rank)
        return rank // self.sp_size

    def sp_group_ranks(self) -> list[list[int]]:
        """All SP groups: consecutive ranks ``[d*sp, ..., d*sp + sp - 1]``."""
        return [list(range(d * self.sp_size, (d + 1) * self.sp_size)) for d in range(self.dp_size)]

    def dp_group_ranks(self) -> list[list[int]]:
        """All DP groups: ranks sharing an SP position, stride ``sp_size``."""
        return [list(range(s, self.world_size, self.sp_size)) for s in range(self.sp_size)]

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp_size > 1

    def describe(self) -> str:
        """One line for start-up logs: every factor against the world size."""
        return f"world_size={self.world_size} = dp_size={self.dp_size} x sp_size={self.sp_size}"

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size}) for {self.describe()}")

    # -- process groups -----------------------------------------------------
    def build_groups(self, rank: int | None = None, timeout: timedelta | None = None,
                     ) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
        """Create the SP and DP groups and return this rank's ``(sp_group, dp_group)``.

        Requires an initialised default process group whose size equals
        ``world_size``. Every rank must call this (``new_group`` is collective
        and must be called for every group in the same order on all ranks).
        A dimension of size 1 gets ``None`` (nothing to communicate).

        ``timeout``: how long the groups' collectives and halo send/recv wait for a
        peer. Pass the default group's: ``new_group`` otherwise falls back to
        torch's 30-minute default, and a hung SP peer would stall the halo exchange
        that long whatever ``init_process_group`` was given.
        """
        if not dist.is_initialized():
            raise RuntimeError("ParallelDims.build_groups needs torch.distributed.init_process_group first")
        actual = dist.get_world_size()
        if actual != self.world_size:
            raise ValueError(
                f"ParallelDims expects world_size={self.world_size} ({self.describe()}) but the process "
                f"group has {actual} ranks; launch {self.world_size} processes or fix parallel.sp_size"
            )
        rank = dist.get_rank() if rank is None else rank
        sp_group = dp_group = None
        for ranks in self.sp_group_ranks():
            group = dist.new_group(ranks, timeout=timeout) if self.sp_enabled else None
            if rank in ranks:
                sp_group = group
        for ranks in self.dp_group_ranks():
            group = dist.new_group(ranks, timeout=timeout) if self.dp_enabled else None
            if rank in ranks:
                dp_group = group
        return sp_group, dp_group
