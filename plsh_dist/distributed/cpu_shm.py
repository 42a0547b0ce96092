"""Unlink DeepSpeed's CPU all-reduce buffers once every local rank has mapped them.

DeepSpeed's CPU accelerator gives each rank of a one-machine job a shared-memory
buffer (``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``,
66 MiB) that every other rank maps, and never unlinks it: each run would keep
``ranks x 66 MiB`` of RAM until the machine reboots. After a barrier every rank
has mapped its peers' buffers, so the names can go; the mappings stay valid
until the processes exit, and a rank killed later leaves nothing behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist

SHM_DIR = Path("/dev/shm")
_PREFIX = "deepspeed_allreduce_buffer"  # SHM_BUFFER_NAME in DeepSpeed's csrc/cpu/comm/shm.cpp


def allreduce_buffer(rank: int, env: dict[str, str] | os._Environ = os.environ) -> Path:
    """Where DeepSpeed's shm_initialize creates ``rank``'s buffer (names from the launcher's env)."""
    return SHM_DIR / f"{_PREFIX}_{os.getuid()}_{env.get('MASTER_ADDR', '')}_{env.get('MASTER_PORT', '')}_{rank}"


def left_buffers_note(shm_dir: Path = SHM_DIR) -> str:
    """"" or a clause naming the buffers still in ``shm_dir`` (older versions', other
    DeepSpeed programs', or a running launch's) and the RAM they hold, for a memory report."""
    held = [p.stat().st_size for p in shm_dir.glob(f"{_PREFIX}_*")] if shm_dir.is_dir() else []
    if not held:
        return ""
    return (f"{len(held)} DeepSpeed all-reduce buffer(s) in {shm_dir} hold {sum(held) / 2**30:.2f} GiB of it: "
            f"rm {shm_dir}/{_PREFIX}_* while no CPU launch runs")


def unlink_cpu_allreduce_buffer() -> None:
    """After ``deepspeed.init_distributed`` on every rank: wait until all have
    mapped their peers' buffers, then unlink this rank's. Call it on CPU runs
    only. A no-op where DeepSpeed made none (ranks on several machines, or no
    launcher's LOCAL_SIZE): that test gives the same answer on every rank of a
    job, so all of them meet at the barrier or none does."""
    world = dist.get_world_size()
    if os.environ.get("LOCAL_SIZE") != str(world):
        return
    if world > 1:
        dist.barrier()
    allreduce_buffer(dist.get_rank()).unlink(missing_ok=True)
