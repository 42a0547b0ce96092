"""Worker processes for tests/experiments/test_halo_sim.py (spawned, gloo): a real
sequence-parallel PLSH forward + backward per rank, whose ``comm_stats``
must equal the simulation's bytes for that rank."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from plsh_dist.distributed.comm_stats import comm_stats, reset_comm_stats
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.distributed.sp_chunks import sp_chunk, sp_positions
from plsh_dist.biases import head_scales
from experiments.halo_sim import AttentionShape, halo_pairs, layer_hash

B, T = 2, 240
SHAPE = AttentionShape(q_heads=4, kv_heads=2, head_dim=8, dtype_bytes=4, layers=1)  # fp32 inputs
CASES = ((None, 4, 0), (30.0, 3, 1))  # (sigma, s, layer): per-head sigma 4 ... 256 (blocks span chunks), shared


def run(rank: int, world: int, init_file: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, SHAPE.q_heads, SHAPE.head_dim, generator=g)
    k, v = (torch.randn(B, T, SHAPE.kv_heads, SHAPE.head_dim, generator=g) for _ in range(2))
    for sigma, s, layer in CASES:
        lsh = layer_hash(sigma, s, layer, SHAPE)
        local = [sp_chunk(x, rank, world).clone().requires_grad_() for x in (q, k, v)]
        reset_comm_stats()
        out = sp_attention.plsh_attention(*local, group=group, sigma=head_scales(sigma, SHAPE.q_heads)[0], num_samples=s, seed=lsh.seed,
                                positions=sp_positions(T, rank, world))
        out.sum().backward()
        stats = comm_stats()
        pairs, _, _ = halo_pairs(lsh, world, T // world, SHAPE.q_heads, SHAPE.kv_heads)
        expected = int(pairs[rank]) * SHAPE.kv_pair_bytes * B
        assert stats["fwd_recv_bytes"] == expected, (rank, sigma, stats, expected)
        assert stats["bwd_sent_bytes"] == expected, (rank, sigma, stats, expected)
        if sigma is None and rank == world - 1:
            assert expected > 0
        dist.barrier()
    dist.destroy_process_group()
