"""The runs table the kernels count a near tile from at large s (``NearBlocks.of``'s torch form,
:mod:`plsh_dist.ops.triton.near_runs`) against the hash's own buckets: every block of every sample
as a run of tokens, merged across samples with its weight, listed by the token it opens on and at
every anchor it holds (pure data: ``torch.equal``). Needs no Triton."""

from collections import Counter

import pytest
import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.triton.tile_bands import CountBias, block_bounds
from plsh_dist.ops.triton.token_layout import TokenLayout
from plsh_dist.ops.triton.near_runs import NEAR_ANCHOR, NearBlocks

SIGMA = torch.tensor([0.8, 3.0, 40.0, 700.0], dtype=torch.float64)


def _brute(lsh, positions, docs):
    """Per head: Counter of opening runs (first, end) and of entering runs (anchor, first, end)."""
    b = lsh.buckets(positions)  # (s, Hh, n)
    doc = docs.ids if docs is not None else torch.zeros(positions.numel(), dtype=torch.long)
    n = positions.numel()
    out = []
    for h in range(b.shape[1]):
        opening, entering = Counter(), Counter()
        for t in range(b.shape[0]):
            first = 0
            for u in range(1, n + 1):
                if u == n or b[t, h, u] != b[t, h, u - 1] or doc[u] != doc[u - 1]:
                    opening[(first, u)] += 1
                    for x in range(-(-first // NEAR_ANCHOR) * NEAR_ANCHOR, u, NEAR_ANCHOR):
                        entering[(x, first, u)] += 1
                    first = u
        out.append((opening, entering))
    return out


def _table(lsh, positions, docs):
    layout = TokenLayout.build(positions, torch.device("cpu"), docs)
    starts, _ = block_bounds(CountBias.of(lsh, torch.device("cpu")), layout, True)
    t = NearBlocks.of(starts, layout.doc)
    n = positions.numel()
    out = []
    for h in range(starts.shape[0]):
        lo, hi = int(t.offsets[h, 0]), int(t.offsets[h, n])
        opening = Counter()
        for e in range(lo, hi):
            opening[(int(t.first[e]), int(t.end[e]))] += int(t.weight[e])
            assert int(t.offsets[h, int(t.first[e])]) <= e < int(t.offsets[h, int(t.first[e]) + 1])
        entering = Counter()
        for a in range(t.enter_offsets.shape[1] - 1):
            for e in range(int(t.enter_offsets[h, a]), int(t.enter_offsets[h, a + 1])):
                entering[(a * NEAR_ANCHOR, int(t.first[e]), int(t.end[e]))] += int(t.weight[e])
        out.append((opening, entering))
    assert t.first.dtype == t.end.dtype == t.offsets.dtype == t.enter_offsets.dtype == torch.int32
    assert t.weight.dtype == torch.float16
    return out


@pytest.mark.parametrize("docs", [False, True], ids=["one", "documents"])
def test_runs_table_equals_the_hash(docs):
    n = 70
    positions = 300 + torch.arange(n)
    documents = None
    if docs:  # 1-token documents and starts inside anchors' spans
        cu = torch.tensor([0, 1, 2, 20, 21, 50, n])
        documents = Documents.from_cu_seqlens(cu, torch.cat([torch.arange(int(c)) for c in cu[1:] - cu[:-1]]))
        positions = documents.positions
    lsh = PositionalLSH(SIGMA, 20, seed=2)
    assert _table(lsh, positions, documents) == _brute(lsh, positions, documents)


def test_runs_table_refuses_more_samples_than_fp16_counts():
    with pytest.raises(ValueError, match="at most 2048"):
        NearBlocks.of(torch.zeros(1, 2049, 4, dtype=torch.int32), None)
