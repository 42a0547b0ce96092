"""Sequence-parallel attention equals the single-process op (outputs and q/k/v
gradients on every rank), moves exactly the halo the hashes require, and
rejects wrong setups clearly. CPU, gloo, processes spawned per world size."""

import pytest
import torch
import torch.multiprocessing as mp

from plsh_dist.distributed.sp_chunks import sp_chunk, sp_positions
from tests.distributed import sp_worker


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sequence_parallel_matches_single_process(world, tmp_path):
    """PLSH (per-head and shared sigma, causal and not, fixed blocks), exact and
    windowed ALiBi and plain causal attention, all of them also with packed documents
    crossing rank boundaries; at world size 2 also the wrong
    setups (mismatched chunk lengths, gapped or swapped positions, different
    seeds or windows), which must raise ValueError on every rank.
    One spawn per world size: process start-up dominates these small cases."""
    cases = ("plsh", "alibi", "documents") + (("errors",) if world == 2 else ())
    mp.spawn(sp_worker.run, args=(world, str(tmp_path / "rendezvous"), cases), nprocs=world, join=True)


def test_sp_chunk_needs_divisible_length():
    x = torch.arange(10)[None, :]
    with pytest.raises(ValueError, match=r"sequence length=10 is not divisible by \[parallel\].sp_size=3"):
        sp_chunk(x, 0, 3)
    assert torch.equal(sp_chunk(x, 1, 2), x[:, 5:])
    assert torch.equal(sp_positions(8, 3, 4, offset=100), torch.tensor([106, 107]))


def test_needed_pairs_brute_force_sees_blocks_across_chunks():
    """The brute-force need used by the byte assertions is not vacuous."""
    b = torch.tensor([[[0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2]]])  # (s=1, H=1, T=12)
    old = sp_worker.T
    sp_worker.T = 12
    try:
        need = sp_worker.needed_pairs(b, 2, 3, causal=True)  # chunk [8, 12): bucket 2 starts at 7
        assert need == [{7}, {7}]
        need = sp_worker.needed_pairs(b, 0, 3, causal=False)  # chunk [0, 4): bucket 0 runs to 4
        assert need == [{4}, {4}]
    finally:
        sp_worker.T = old
