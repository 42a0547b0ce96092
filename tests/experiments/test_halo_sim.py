"""The halo simulation equals the real halo exchange (HaloExchange, the planner's
sp_traffic, comm_stats of a real SP run) at small sizes, and the ring /
Ulysses formulas equal hand-computed cases."""


import pytest
import torch
import torch.multiprocessing as mp

from plsh_dist.distributed.halo import HaloExchange, plsh_needs
from plsh_dist.distributed.group_chunks import GroupChunks
from experiments.halo_sim import (QWEN3_0_6B, AttentionShape, halo_pairs, layer_hash, ring_bytes,
                                     simulate_halo, ulysses_bytes)
from plsh_dist.models import AttentionConfig
from plsh_dist.plan.attention_cost import attention_cost
from plsh_dist.plan.halo_traffic import sp_traffic
from tests.experiments import halo_sim_worker


@pytest.mark.parametrize("sigma,s,P,tokens,offset", [
    (None, 8, 8, 64, 0),      # per-head sigma up to 256: blocks reach across several 64-token chunks
    (None, 100, 16, 256, 0),
    (256.0, 100, 6, 100, 0),  # one hash for all heads, every rank reaches far back
    (3.0, 4, 5, 7, 13),       # chunks after an offset: positions before it exist nowhere
])
def test_simulation_equals_every_ranks_halo_exchange(sigma, s, P, tokens, offset):
    for layer in range(3):
        lsh = layer_hash(sigma, s, layer)
        pairs, slots, peers = halo_pairs(lsh, P, tokens, 16, 8, offset=offset)
        for r in range(P):
            chunks = GroupChunks(None, r, P, tuple(range(P)), tuple(offset + i * tokens for i in range(P)), tokens)
            exchange = HaloExchange.build(chunks, plsh_needs(lsh, chunks, 16, 8, causal=True))
            assert pairs[r] == exchange.recv_tokens(), (layer, r)
            assert slots[r] == exchange.left_pos.numel() and peers[r] == len(exchange.recv), (layer, r)
        assert pairs[0] == 0 and pairs[1:].min() > 0
        if sigma != 3.0:
            assert peers.max() >= 3  # the case exercises halos spanning several ranks


@pytest.mark.parametrize("sigma", [None, 256.0])
def test_simulation_equals_the_planners_traffic(sigma):
    shape = AttentionShape(q_heads=16, kv_heads=8, head_dim=128, dtype_bytes=2, layers=3)
    sim = simulate_halo(8 * 512, 8, sigma, 10, shape)
    attn_cfg = AttentionConfig(bias="plsh", sigma=sigma, num_samples=10, sampler="iid")
    cost = attention_cost(attn_cfg, 16, "cpu", torch.float32)
    assert torch.equal(cost.kernel_hash(0).sigma, layer_hash(sigma, 1, 0, shape).sigma)  # the simulation's hash
    planner = sp_traffic(cost, attn_cfg, run_seed=0, layers=3, sp=8, tokens=512, batch=1, q_heads=16, kv_heads=8,
                         head_dim=128, b=2)
    for a, b in zip(sim.layers, planner, strict=True):
        assert a.bytes_max == b.forward_bytes_max and a.bytes_mean == pytest.approx(b.forward_bytes_mean, rel=1e-12)
        assert a.slots_max == b.halo_slots_max


def test_simulation_equals_comm_stats_of_a_real_sp_run(tmp_path):
    """3 gloo ranks, per-head and shared sigma: forward bytes received and backward bytes sent."""
    mp.start_processes(halo_sim_worker.run, args=(3, str(tmp_path / "rendezvous")), nprocs=3, join=True,
                       start_method="fork")  # forked: the workers skip re-importing torch and the package


def test_ring_and_ulysses_by_hand():
    shape = AttentionShape(q_heads=8, kv_heads=2, head_dim=16, dtype_bytes=2, layers=1)
    # ring, T = 1024 on 4 ranks: 3 chunks of 256 tokens x 2 kv heads x (K + V) 16 x 2 bytes
    ring = ring_bytes(1024, 4, shape)
    assert ring.forward == 3 * 256 * 2 * 2 * 16 * 2 == 98_304 and ring.backward == 2 * 98_304
    # Ulysses on 2 ranks: 1/2 of the local q, k, v, out (512 tokens x (8 + 2 + 2 + 8) heads x 16 x 2 bytes)
    uly = ulysses_bytes(1024, 2, shape)
    assert uly.forward == 0.5 * 512 * 20 * 16 * 2 == 163_840 and uly.backward == uly.forward and uly.feasible
    # 4 ranks > 2 kv heads: kv replicated to one head per rank (8 + 4 + 4 + 8 heads); 16 ranks > 8 query heads
    assert ulysses_bytes(1024, 4, shape).forward == 0.75 * 256 * 24 * 16 * 2 == 147_456
    assert not ulysses_bytes(1024, 16, shape).feasible
    # Qwen3-0.6B at 128k on 8 ranks: 448 MiB (ring) and 168 MiB (Ulysses) per layer, forward
    assert ring_bytes(2**17, 8, QWEN3_0_6B).forward == 7 * 2**14 * 8 * 128 * 2 * 2 == 448 * 2**20
    assert ulysses_bytes(2**17, 8, QWEN3_0_6B).forward == 168 * 2**20
    with pytest.raises(ValueError, match="multiple of sp"):
        ring_bytes(1000, 3, shape)


def test_planning_time_small():
    from experiments.halo_sim import planning_time

    shape = AttentionShape(q_heads=16, kv_heads=8, head_dim=128, dtype_bytes=2, layers=2)
    pt = planning_time(4096, 4, None, 4, shape, repeats=1, varlen_max_elements=4 * 16 * 256)
    assert pt.halo > 0 and 0 < pt.varlen_buckets < pt.varlen
    assert pt.varlen_extrapolated_from == 256  # 1024-token chunk, timed on 256 tokens and scaled
    assert planning_time(4096, 4, 256.0, 4, shape, repeats=1).varlen_extrapolated_from is None
