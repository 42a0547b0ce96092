"""Worker of the model-level sequence-parallel test (spawned, gloo).

Every rank builds the same tiny model from one seed and runs the whole
sequence single-process as the reference; then, with the runtime's SP group
set, runs only its contiguous chunk with the chunk's *global* position_ids.
Its logits must equal the reference's slice, and the parameter gradients of
the per-chunk losses, summed over ranks, must equal the full run's.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist

from plsh_dist.models import apply_sequence_parallel
from plsh_dist.distributed.sp_chunks import sp_chunk, sp_positions
from plsh_dist.models import AttentionConfig, build_model, get_runtime, presets, set_attention_mode
from tests.tolerances import FP64

B, T, OFFSET = 2, 48, 16
# One mode per SP code path (hash halo, windowed ALiBi, all-gathered keys);
# the ops' own SP tests cover every op at world sizes 1-4.
MODES = [
    AttentionConfig(bias="plsh", num_samples=3),  # per-head sigma 4 .. 256: blocks cross chunk borders
    AttentionConfig(bias="window", window=10),
    AttentionConfig(bias="truncated", truncate_c=0.25),  # per-head windows 1, 4, 16, 64
    AttentionConfig(bias="none", rope=True),
]


def _loss(logits: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """A token-separable loss (sum over tokens), so chunk losses add up to the full one."""
    return (logits * probe).sum()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def run(rank: int, world: int, init_file: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)  # several processes share two cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # same weights on every rank
        model = build_model(dataclasses.replace(presets["tiny"], num_layers=2), MODES[0], dtype=torch.float64)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 512, (B, T), generator=g)
        probe = torch.randn(B, T, 512, generator=g, dtype=torch.float64)
        full_pos = (OFFSET + torch.arange(T))[None].expand(B, -1)
        chunk_pos = sp_positions(T, rank, world, offset=OFFSET)[None].expand(B, -1)
        for cfg in MODES:
            set_attention_mode(model, cfg)
            runtime = get_runtime(model)
            runtime.set_step(4, 1)

            apply_sequence_parallel(model, None)
            model.zero_grad(set_to_none=True)
            ref = model(ids, position_ids=full_pos).logits
            _loss(ref, probe).backward()
            ref_grads = _grads(model)

            apply_sequence_parallel(model, dist.group.WORLD)
            model.zero_grad(set_to_none=True)
            out = model(sp_chunk(ids, rank, world), position_ids=chunk_pos).logits
            _loss(out, sp_chunk(probe, rank, world)).backward()
            torch.testing.assert_close(out, sp_chunk(ref.detach(), rank, world), **FP64, msg=cfg.bias)
            for name, grad in _grads(model).items():
                dist.all_reduce(grad)  # data-parallel-style sum of the chunks' gradients
                torch.testing.assert_close(grad, ref_grads[name], **FP64, msg=f"{cfg.bias} {name}")
    finally:
        dist.destroy_process_group()
