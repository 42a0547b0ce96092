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


def _setup_worker(rank: int, world: int, port: int, overrides: list[str], out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    import torch

    torch.set_num_threads(1)
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from plsh_dist.config import load_config
    from plsh_dist.train.loop import setup

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        session = setup(load_config(None, overrides))
        optimizer = session.engine.optimizer
        if hasattr(optimizer, "_lazy_init_hp_params_optimizer_state"):  # ZeRO 1-2: DeepSpeed links the
            optimizer._lazy_init_hp_params_optimizer_state()  # moments to the parameters at the first step
        state = {}
        for name, param in session.engine.module.named_parameters():  # collective under ZeRO: every rank asks
            if session.cfg.deepspeed.zero_stage == 0:  # fp32 without ZeRO: torch's AdamW holds it whole
                moments = optimizer.state[param]
                state[name] = {"fp32": param.detach().clone(), "exp_avg": moments["exp_avg"].clone(),
                               "exp_avg_sq": moments["exp_avg_sq"].clone(), "model": param.detach().clone()}
                continue
            state[name] = {"fp32": safe_get_full_fp32_param(param).clone(),
                           **{key: safe_get_full_optimizer_state(param, key).clone()
                              for key in ("exp_avg", "exp_avg_sq")},
                           "model": _full_weight(param, session)}
        if rank == 0:
            out["result"] = {"state": state, "start_step": session.start_step,
                             "lr": [g["lr"] for g in session.engine.optimizer.param_groups],
                             "position": session.data.global_position}
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _full_weight(param, session):
    """The model's own (low-precision under bf16) copy of ``param``, gathered under ZeRO-3."""
    if session.cfg.deepspeed.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters([param]):
            return param.detach().clone()
    return param.detach().clone()


def run_setup(world: int, overrides: list[str]) -> dict:
    """``plsh_dist.train.loop.setup`` (device, data, engine, resume) of one config in ``world``
    spawned processes, no step taken; rank 0's view of what was loaded: every parameter's
    gathered fp32 master weights, AdamW moments and model weights (``state[name]``), the start
    step, the optimizer's learning rates and the data stream's global position."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_setup_worker, args=(world, free_port(), overrides, out), nprocs=world)
        return dict(out["result"])
