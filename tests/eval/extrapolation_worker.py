"""Spawned rank of the SP evaluation test: gloo, file rendezvous, SP group = world."""

from __future__ import annotations

import json

import torch.distributed as dist


def run(rank: int, world: int, rendezvous: str, export: str, kwargs: dict, out: str) -> None:
    from plsh_dist.checkpoint.loading import load_model
    from plsh_dist.eval.eval_data import load_eval_tokens
    from plsh_dist.eval.extrapolation import EvalSettings, evaluate_model

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        ck = load_model(export)
        tokens, _ = load_eval_tokens(ck, None)
        rows = evaluate_model(ck.model, ck.trained_attention, tokens, EvalSettings(progress=False, **kwargs),
                              sp_group=dist.group.WORLD)
        if rank == 0:
            with open(out, "w") as fh:
                json.dump(rows, fh)
    finally:
        dist.destroy_process_group()
