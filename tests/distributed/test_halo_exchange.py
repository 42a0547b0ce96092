"""The halo exchange without processes: block starts agree with the hash, and the
planned halo of every rank is exactly the brute-force need from the buckets."""

import pytest
import torch

from plsh_dist.distributed.halo import HaloExchange, plsh_needs
from plsh_dist.distributed.group_chunks import GroupChunks
from plsh_dist.hashing import PositionalLSH, alibi_slopes


def test_bucket_start_is_the_first_position_of_each_block():
    lsh = PositionalLSH(torch.tensor([0.6, 3.0, 40.0, 700.0]), 5, seed=3)
    positions = torch.arange(100_000, 103_000)
    buckets = lsh.buckets(positions)  # (s, H, n)
    p = positions[None, None, :].expand_as(buckets)
    # bucket_of agrees with the hash's own buckets bit for bit
    for i in (0, 1, 777, 2999):
        assert torch.equal(lsh.bucket_of(p[:, :, i]), buckets[:, :, i])
    starts = lsh.bucket_start(buckets[:, :, 1500])
    assert torch.equal(starts, lsh.block_start_of(int(positions[1500])))
    for t in range(5):
        for h in range(4):
            first = positions[buckets[t, h] == buckets[t, h, 1500]].min()
            if first > positions[0]:  # block fully inside the range: its start is known
                assert int(starts[t, h]) == int(first)


@pytest.mark.parametrize("P,causal", [(3, True), (4, False)])
def test_exchange_receives_exactly_the_needed_pairs(P, causal):
    T, Hq, Hkv = 600, 4, 2
    lsh = PositionalLSH(alibi_slopes(Hq).reciprocal() * 20, 4, seed=9)
    Tl, offset = T // P, 50
    buckets = lsh.buckets(torch.arange(T) + offset)
    for r in range(P):
        chunks = GroupChunks(None, r, P, tuple(range(P)), tuple(offset + i * Tl for i in range(P)), Tl)
        exchange = HaloExchange.build(chunks, plsh_needs(lsh, chunks, Hq, Hkv, causal))
        c0, c1 = r * Tl, (r + 1) * Tl
        expected = 0
        for h in range(Hkv):
            need = torch.zeros(T, dtype=torch.bool)
            for t in range(4):
                for hq in range(h * 2, h * 2 + 2):
                    need |= torch.isin(buckets[t, hq], buckets[t, hq, c0:c1])
            need[c0:c1] = False
            if causal:
                need[c1:] = False
            expected += int(need.sum())
        assert exchange.recv_tokens() == expected
        sent = {}
        for t in exchange.recv:
            for piece in t.pieces:  # every piece lies inside its owner's chunk
                assert 0 <= piece.src and piece.src + piece.length <= Tl
                sent[t.peer] = sent.get(t.peer, 0) + piece.length
        assert set(sent) <= set(range(P)) - {r}
