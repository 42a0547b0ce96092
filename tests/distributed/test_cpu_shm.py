"""DeepSpeed's CPU all-reduce buffers are unlinked once mapped (cpu_shm.py).

Two ranks started as DeepSpeed's launcher starts them on one machine
(LOCAL_SIZE = world), so ``deepspeed.init_distributed`` creates one
``/dev/shm`` buffer per rank. The worker shows that the buffer was made, that
both names are gone after ``unlink_cpu_allreduce_buffer``, and that DeepSpeed's
shared-memory all-reduce still sums through the mappings afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from plsh_dist.distributed.cpu_shm import allreduce_buffer
from plsh_dist.distributed.ports import free_port

ROOT = Path(__file__).resolve().parents[2]

_WORKER = """
import sys, torch, torch.distributed as dist
import deepspeed, deepspeed.comm as ds_comm
from plsh_dist.distributed.cpu_shm import allreduce_buffer, unlink_cpu_allreduce_buffer
deepspeed.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
assert ds_comm.comm.cdb.shm_comm_op is not None, "DeepSpeed built no shared-memory op"
assert allreduce_buffer(rank).exists(), "DeepSpeed made no buffer: nothing to test"
unlink_cpu_allreduce_buffer()
dist.barrier()
assert not allreduce_buffer(0).exists() and not allreduce_buffer(1).exists()
x = torch.full((1000,), float(rank + 1))
ds_comm.inference_all_reduce(x)
print("sum", x[0].item(), x[-1].item())
"""


def test_buffers_are_unlinked_and_the_shared_memory_all_reduce_still_works(tmp_path):
    port = str(free_port())
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
               WORLD_SIZE="2", LOCAL_SIZE="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    ranks = [subprocess.Popen([sys.executable, "-c", _WORKER], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        results = [p.communicate(timeout=240) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    for p, (out, err) in zip(ranks, results):
        assert p.returncode == 0, err[-3000:]
        assert "sum 3.0 3.0" in out, out + err[-2000:]
    assert not [p for p in (allreduce_buffer(r, env) for r in range(2)) if p.exists()]
