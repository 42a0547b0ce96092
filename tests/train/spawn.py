"""Run ``plsh_dist.train.train`` in ``world`` spawned processes (gloo on CPU)."""

from __future__ import annotations

import copy
import os
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

from plsh_dist.distributed.ports import free_port


def _worker(rank: int, world: int, port: int, runs: list[list[str]], stop_after: list, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    import torch

    torch.set_num_threads(1)  # 2 cores shared by all ranks
    from plsh_dist.config import load_config
    from plsh_dist.cpu_paths import code_paths
    from plsh_dist.train import train

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        for overrides, stop in zip(runs, stop_after):
            cfg = load_config(None, overrides)
            before = copy.deepcopy(cfg)
            res = train(cfg, stop_after=stop)
            results.append({"losses": res.losses, "grad_norms": res.grad_norms, "first_step": res.first_step,
                            "val_loss": res.val_loss, "config_unchanged": cfg == before,
                            "cpu_paths": code_paths()})
        if rank == 0:
            out["results"] = results
    finally:
        dist.destroy_process_group()
    # The results are with the parent: leave without the interpreter's teardown. Once in a CI run
    # (2026-12-05), a rank of a completed ZeRO-3 run aborted there ("terminate called without an
    # active exception": a C++ thread still joinable when statics were destroyed), which failed the
    # run although every step, checkpoint and export was done. The launchers' own exits are tested
    # through the real entry points (make test-slow, make test-cluster).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_training(world: int, *runs: list[str], stop_after: list | None = None) -> list[dict]:
    """Train each override list in turn inside the same ``world`` processes; rank 0's results
    (``config_unchanged``: ``train`` left the config it was given as it was; ``cpu_paths``: the
    CPU code paths the ranks' torch ran, ``plsh_dist.cpu_paths.code_paths()``). The ranks inherit
    this process's environment (set ``plsh_dist.cpu_paths.PINNED_CPU_ENV`` in it to pin them)."""
    stop_after = stop_after or [None] * len(runs)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(world, free_port(), list(runs), stop_after, out), nprocs=world)
        return list(out["results"])
