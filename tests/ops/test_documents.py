"""Packed documents: a packed row equals each document run on its own (fp64,
outputs and dq/dk/dv), in every attention mode and implementation; rows may
have different layouts; positions may restart per document; bad layouts give
ValueErrors that name the argument and the fix."""

import pytest
import torch

from plsh_dist.hashing import PositionalLSH, alibi_slopes
from plsh_dist.ops import alibi_attention, causal_attention, fixed_blocks_attention, plsh_attention
from plsh_dist.ops.backends import VARLEN_REFERENCE
from plsh_dist.ops.documents import check_cu_seqlens, cu_seqlens_from_position_ids, flat_documents
from plsh_dist.ops.plsh import PLSHAttentionFunction
from plsh_dist.ops.reference import dense_attention
from tests.tolerances import FP64

HQ, HKV, D = 4, 2, 8
T = 96
# Row 0: a 1-token document, a one-block document, a long one; row 1: other cuts.
ROW_DOCS = [[1, 5, 90], [40, 1, 55]]


def _cu(rows=ROW_DOCS, seqlen=T):
    offsets = [0]
    for row in rows:
        assert sum(row) == seqlen
        for n in row:
            offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32)


def _qkv(B, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda H: torch.randn(B, n, H, D, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    return make(HQ), make(HKV), make(HKV), torch.randn(B, n, HQ, D, generator=g, dtype=torch.float64)


def _sigma(per_head):
    return alibi_slopes(HQ).reciprocal().double() * 4 if per_head else 7.5


MODES = {
    "plsh_per_sample": lambda per_head: (plsh_attention, dict(sigma=_sigma(per_head), num_samples=5, seed=3,
                                                              method="per_sample", backend="torch")),
    "plsh_onepass": lambda per_head: (plsh_attention, dict(sigma=_sigma(per_head), num_samples=5, seed=3,
                                                           method="onepass", backend="torch")),
    "plsh_math": lambda per_head: (plsh_attention, dict(sigma=_sigma(per_head), num_samples=3, seed=1,
                                                        method="per_sample", backend="math")),
    "fixed_blocks": lambda per_head: (fixed_blocks_attention, dict(sigma=_sigma(per_head), method="per_sample")),
    "fixed_blocks_onepass": lambda per_head: (fixed_blocks_attention, dict(sigma=_sigma(per_head), method="onepass")),
    "alibi": lambda per_head: (alibi_attention, dict(slopes=alibi_slopes(HQ), chunk_size=16)),
    "alibi_window": lambda per_head: (alibi_attention, dict(slopes=alibi_slopes(HQ), window=9, chunk_size=16)),
    "alibi_truncated": lambda per_head: (alibi_attention, dict(slopes=alibi_slopes(HQ),
                                                               window=torch.tensor([3, 9, 30, 9]))),
    "causal": lambda per_head: (causal_attention, {}),
}


def _separately(fn, kw, q, k, v, dout, rows, positions, causal):
    """Each document on its own (batch 1, its own positions): outputs and grads in the packed layout."""
    outs, grads = torch.zeros_like(dout), [torch.zeros_like(x) for x in (q, k, v)]
    for b, row in enumerate(rows):
        a = 0
        for n in row:
            sl = (slice(b, b + 1), slice(a, a + n))
            qs, ks, vs = (x.detach()[sl].clone().requires_grad_() for x in (q, k, v))
            pos = positions[b, a:a + n] if positions.dim() == 2 else positions[a:a + n]
            out = fn(qs, ks, vs, positions=pos, causal=causal, **kw)
            g = torch.autograd.grad(out, (qs, ks, vs), dout[sl])
            outs[sl] = out.detach()
            for acc, x in zip(grads, g):
                acc[sl] = x
            a += n
    return [outs, *grads]


def _packed(fn, kw, q, k, v, dout, cu, positions, causal):
    out = fn(q, k, v, positions=positions, causal=causal, cu_seqlens=cu, **kw)
    return [out, *torch.autograd.grad(out, (q, k, v), dout)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "shared"])
@pytest.mark.parametrize("mode", list(MODES))
def test_packed_rows_equal_documents_alone(mode, per_head, causal):
    if mode == "causal" and not causal:
        pytest.skip("causal_attention's non-causal form is the same code path as its causal one")
    fn, kw = MODES[mode](per_head)
    q, k, v, dout = _qkv(2, T)
    positions = torch.arange(T) + 1000  # absolute positions: the hash and ALiBi read them
    got = _packed(fn, kw, q, k, v, dout, _cu(), positions, causal)
    want = _separately(fn, kw, q, k, v, dout, ROW_DOCS, positions, causal)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, **FP64, msg=lambda m: f"{mode} {name}: {m}")


@pytest.mark.parametrize("mode", ["plsh_per_sample", "plsh_onepass", "alibi", "causal"])
def test_positions_restarting_per_document(mode):
    """transformers' packed rows: position_ids restart at 0 per document; each document is
    hashed at its own positions 0..n-1, exactly as on its own."""
    fn, kw = MODES[mode](True)
    q, k, v, dout = _qkv(2, T, seed=5)
    positions = torch.cat([torch.cat([torch.arange(n) for n in row])[None] for row in ROW_DOCS])  # (2, T)
    cu = cu_seqlens_from_position_ids(positions)
    torch.testing.assert_close(cu, _cu())
    got = _packed(fn, kw, q, k, v, dout, cu, positions, True)
    want = _separately(fn, kw, q, k, v, dout, ROW_DOCS, positions, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **FP64)


@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "shared"])
def test_varlen_strategy_cuts_blocks_at_documents(per_head):
    """The CUDA strategy's varlen calls and rows layout (on the reference kernel) with documents."""
    q, k, v, dout = _qkv(2, T, seed=2)
    lsh = PositionalLSH(_sigma(per_head), 4, seed=9)
    docs = flat_documents(None, _cu(), 2, T)
    flat = [x.reshape(1, 2 * T, *x.shape[2:]) for x in (q, k, v)]
    out = PLSHAttentionFunction.apply(*flat, lsh, docs.positions, True, D**-0.5, VARLEN_REFERENCE, docs)[0]
    want = plsh_attention(q, k, v, sigma=_sigma(per_head), num_samples=4, seed=9, method="per_sample",
                          backend="torch", cu_seqlens=_cu())
    torch.testing.assert_close(out.view(2, T, HQ, D), want, **FP64)
    g_got = torch.autograd.grad(out, flat, dout.reshape(1, 2 * T, HQ, D))
    g_want = torch.autograd.grad(want, (q, k, v), dout)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a.view(b.shape), b, **FP64)


def test_document_masked_plsh_matches_dense_reference():
    """The estimator with documents is attention under M~ * [doc(i) == doc(j)]."""
    q, k, v, _ = _qkv(1, T, seed=4)
    cu = _cu([ROW_DOCS[0]])
    lsh = PositionalLSH(6.0, 6, seed=2)
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor(ROW_DOCS[0]))
    same = (doc[:, None] == doc[None, :]).double()
    # blocks cut at document starts: the averaged mask of the cut blocks
    b = lsh.buckets(torch.arange(T))[:, 0]  # (s, T)
    cut = (b[:, :, None] == b[:, None, :]).double() * same
    want = dense_attention(q, k, v, weights=cut.mean(0)[None], causal=True)
    got = plsh_attention(q, k, v, sigma=6.0, num_samples=6, seed=2, cu_seqlens=cu)
    torch.testing.assert_close(got, want, **FP64)


def test_return_lse_with_documents():
    q, k, v, _ = _qkv(2, T, seed=6)
    out, lse = plsh_attention(q, k, v, sigma=5.0, num_samples=3, seed=0, cu_seqlens=_cu(), return_lse=True)
    assert lse.shape == (2, HQ, T)
    _, lse0 = plsh_attention(q[:1, :1], k[:1, :1], v[:1, :1], sigma=5.0, num_samples=3, seed=0, return_lse=True)
    torch.testing.assert_close(lse[:1, :, :1], lse0, **FP64)  # a 1-token document sees itself only


BAD = [
    (torch.tensor([0, 50, 40, 192]), "increase strictly"),
    (torch.tensor([1, 96, 192]), "start at 0"),
    (torch.tensor([0, 96, 190]), "end at batch \\* seqlen"),
    (torch.tensor([0, 50, 150, 192]), "row boundary"),
    (torch.tensor([[0, 96, 192]]), "1-D"),
    (torch.tensor([0.0, 96.0, 192.0]), "int32/int64"),
]


@pytest.mark.parametrize("cu,match", BAD, ids=[m for _, m in BAD])
def test_bad_cu_seqlens_name_the_argument(cu, match):
    q, k, v, _ = _qkv(2, T)
    with pytest.raises(ValueError, match="cu_seqlens") as err:
        plsh_attention(q, k, v, sigma=4.0, num_samples=2, seed=0, cu_seqlens=cu)
    assert err.match(match)
    with pytest.raises(ValueError, match=match):
        check_cu_seqlens(cu, 2, T)


def test_positions_must_increase_within_documents():
    q, k, v, _ = _qkv(2, T)
    positions = torch.arange(T).flip(0)
    with pytest.raises(ValueError, match="within each document"):
        alibi_attention(q, k, v, slopes=alibi_slopes(HQ), positions=positions, cu_seqlens=_cu())
    with pytest.raises(ValueError, match=r"\(batch, seqlen\)"):
        plsh_attention(q, k, v, sigma=4.0, num_samples=2, seed=0, positions=torch.arange(3 * T).view(3, T),
                       cu_seqlens=_cu())


def test_document_cut_blocks_are_grouped_by_length():
    """Cut pieces of every length would each be padded to the longest block; grouped by
    length, each grid pads at most 2x (the last class aside), and the parts cover every
    token once, in block order."""
    from plsh_dist.hashing import block_starts
    from plsh_dist.ops.cpu.blocks import BlockGrid, GroupedGrids, block_grid

    buckets = torch.arange(400) // 100  # four blocks of 100
    doc_starts = torch.zeros(400, dtype=torch.bool)
    doc_starts[[3, 150, 390]] = True  # pieces of 3, 97, 50, 50, 100, 90, 10
    grid = block_grid(buckets, None, doc_starts)
    assert isinstance(grid, GroupedGrids)
    tokens = torch.cat([t for _, t in grid.parts])
    assert torch.equal(tokens.sort().values, torch.arange(400))
    slots = sum(part.num_blocks * part.max_len for part, _ in grid.parts)
    assert slots < 7 * 100 * 0.8  # one grid would hold 7 x 100 slots
    assert isinstance(block_grid(buckets, None, None), BlockGrid)  # no documents: the single grid
    assert bool(block_starts(buckets)[100])
