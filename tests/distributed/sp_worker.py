"""Worker processes for the sequence-parallel tests (spawned, gloo).

Every rank builds the full inputs from one seed, runs the single-process op
on the whole sequence as the reference, then runs the SP op on its own
chunk and asserts its output slice, its q/k/v gradient slices and (halo
paths) the exact bytes it received. A failed assertion in any rank fails the
spawning test with that rank's traceback.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.distributed as dist

from plsh_dist.distributed.comm_stats import comm_stats, reset_comm_stats
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.distributed.sp_chunks import sp_chunk, sp_positions
from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes
from plsh_dist.ops import alibi_attention, causal_attention, fixed_blocks_attention, plsh_attention
from tests.tolerances import for_dtype

B, T, HQ, HKV, D = 2, 240, 4, 2, 8  # T divisible by 1, 2, 3, 4


def init(rank: int, world: int, init_file: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)  # several processes share two cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def _inputs(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    make = lambda H: torch.randn(B, T, H, D, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    return make(HQ), make(HKV), make(HKV), torch.randn(B, T, HQ, D, generator=g, dtype=torch.float64).to(dtype)


def _run_and_compare(op, dtype, data_seed, offset, group, **kw):
    """Reference on the full sequence (the single-process ``op``) vs its SP
    twin on this rank's chunk; returns comm stats of the SP call."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    q, k, v, g = _inputs(dtype, data_seed)
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = op(*full, positions=torch.arange(T) + offset, **kw)
    ref_grads = torch.autograd.grad(ref, full, g)

    local = [sp_chunk(x, r, P).clone().requires_grad_() for x in (q, k, v)]
    reset_comm_stats()
    sp_op = functools.partial(getattr(sp_attention, op.__name__), group=group)
    out = sp_op(*local, positions=sp_positions(T, r, P, offset), **kw)
    grads = torch.autograd.grad(out, local, sp_chunk(g, r, P))
    stats = comm_stats()

    tol = for_dtype(dtype)
    where = f"rank {r}/{P} {getattr(op, '__name__', op)} {dtype} {kw}"
    assert out.dtype == dtype and out.shape == local[0].shape, where
    torch.testing.assert_close(out, sp_chunk(ref, r, P), **tol, msg=lambda m: f"{where} out: {m}")
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a, sp_chunk(b, r, P), **tol, msg=lambda m: f"{where} d{name}: {m}")
    assert stats["calls"] == 1, stats
    return stats


def needed_pairs(buckets: torch.Tensor, rank: int, P: int, causal: bool) -> list[set[int]]:
    """Brute force from the hashes: per kv head, the global indices outside
    chunk ``rank`` that share a block with some position inside it."""
    Tl = T // P
    c0, c1 = rank * Tl, (rank + 1) * Tl
    s, H, _ = buckets.shape
    need = [set() for _ in range(HKV)]
    for t in range(s):
        for hq in range(HQ):
            b = buckets[t, 0 if H == 1 else hq]
            inside = b[c0:c1]
            outside = torch.isin(b, inside)
            outside[c0:c1] = False
            if causal:
                outside[c1:] = False
            need[hq // (HQ // HKV)].update(torch.nonzero(outside).flatten().tolist())
    return need


def _check_halo_bytes(stats, lsh, offset, causal, dtype, group):
    P, r = dist.get_world_size(group), dist.get_rank(group)
    buckets = lsh.buckets(torch.arange(T) + offset)
    needs = [needed_pairs(buckets, i, P, causal) for i in range(P)]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    expected = sum(len(n) for n in needs[r]) * B * D * itemsize * 2  # k and v
    assert stats["fwd_recv_bytes"] == expected, (r, stats, expected)
    assert stats["bwd_sent_bytes"] == expected, (r, stats, expected)  # every halo gradient goes home
    # what this rank sends = what the others need from its chunk
    Tl = T // P
    mine = range(r * Tl, (r + 1) * Tl)
    sent = sum(len(n & set(mine)) for i in range(P) for n in needs[i]) * B * D * itemsize * 2
    assert stats["fwd_sent_bytes"] == sent and stats["bwd_recv_bytes"] == sent, (r, stats, sent)
    return needs


def run(rank: int, world: int, init_file: str, cases: tuple[str, ...]) -> None:
    """Spawn target: one process group, then the named case functions in order
    (one spawn per world size keeps the tests' process start-up cost low)."""
    init(rank, world, init_file)
    group = dist.new_group(list(range(world)))
    for name in cases:
        CASES[name](rank, world, group)
        dist.barrier()
    dist.destroy_process_group()


def plsh_cases(rank: int, world: int, group) -> None:
    for method in ("per_sample", "onepass"):  # same estimator, same blocks, same halo
        _plsh_cases(rank, world, group, method)


def _plsh_cases(rank: int, world: int, group, method: str) -> None:
    sigma = torch.tensor([0.7, 3.0, 25.0, 120.0], dtype=torch.float64)  # tiny blocks ... blocks ~ T
    for dtype, causal, s, offset in [(torch.float64, True, 4, 1000), (torch.float64, False, 3, 0)]:
        stats = _run_and_compare(plsh_attention, dtype, 1, offset, group, sigma=sigma, num_samples=s,
                                 seed=11, causal=causal, method=method)
        needs = _check_halo_bytes(stats, PositionalLSH(sigma, s, 11), offset, causal, dtype, group)
        if world >= 3:  # the test must exercise blocks spanning 3+ chunks
            Tl = T // world
            assert any(min(n) < (i - 1) * Tl for i, nh in enumerate(needs) for n in nh if n), needs
        if world > 1:
            assert sum(len(n) for n in needs[-1]) < (world - 1) * (T // world) * HKV  # no full all-gather
    # fp32, one hash shared by all heads, stratified sampler
    stats = _run_and_compare(plsh_attention, torch.float32, 2, 7, group, sigma=30.0, num_samples=3, seed=5,
                             sampler="stratified", method=method)
    _check_halo_bytes(stats, PositionalLSH(30.0, 3, 5, "stratified"), 7, True, torch.float32, group)
    # fixed blocks of 2 * 50 = 100 tokens, aligned at 0
    stats = _run_and_compare(fixed_blocks_attention, torch.float64, 3, 0, group, sigma=50.0, method=method)
    _check_halo_bytes(stats, FixedBlocks(50.0), 0, True, torch.float64, group)


def alibi_cases(rank: int, world: int, group) -> None:
    slopes = alibi_slopes(HQ) / 4  # gentle slopes: far keys still matter
    P, r, Tl = world, rank, T // world
    for dtype, causal in [(torch.float64, True), (torch.float32, False)]:
        stats = _run_and_compare(alibi_attention, dtype, 4, 300, group, slopes=slopes, causal=causal)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        assert stats["fwd_recv_bytes"] == (P - 1) * Tl * B * HKV * D * 2 * itemsize, stats  # all-gather
    # longer than a chunk at 4 ranks: the halo spans two ranks; per head (truncated ALiBi): the widest
    for window in (70, torch.tensor([5, 70, 12, 5])):
        for causal in (True, False):
            stats = _run_and_compare(alibi_attention, torch.float64, 5, 12, group, slopes=slopes, causal=causal,
                                     window=window)
            widest = int(torch.as_tensor(window).max())
            left = min(widest - 1, r * Tl)
            right = 0 if causal else min(widest - 1, (P - 1 - r) * Tl)
            expected = (left + right) * B * HKV * D * 2 * 8
            assert stats["fwd_recv_bytes"] == expected and stats["bwd_sent_bytes"] == expected, (r, stats, expected)
    _run_and_compare(causal_attention, torch.float64, 6, 0, group)


def error_cases(rank: int, world: int, group) -> None:
    """Wrong setups fail with a clear ValueError on every rank, before any K/V moves."""
    q = torch.randn(1, 12, 2, 8)
    kw = dict(sigma=4.0, num_samples=2, seed=0)
    plsh = functools.partial(sp_attention.plsh_attention, group=group)
    alibi = functools.partial(sp_attention.alibi_attention, group=group)

    def expect(msg, fn):
        reset_comm_stats()
        try:
            fn()
        except ValueError as e:
            assert msg in str(e), (msg, str(e))
        else:
            raise AssertionError(f"rank {rank}: expected ValueError with {msg!r}")
        stats = comm_stats()
        assert stats["sent_bytes"] == stats["recv_bytes"] == 0, stats

    n = 12 if rank == 0 else 10
    qn = q[:, :n]
    expect("mismatched chunk lengths",
           lambda: plsh(qn, qn, qn, positions=torch.arange(n) + 12 * rank, **kw))
    gapped = torch.arange(12) * 2 + 24 * rank
    expect("not contiguous", lambda: plsh(q, q, q, positions=gapped, **kw))
    swapped = torch.arange(12) + 12 * (world - 1 - rank)
    expect("out of order", lambda: plsh(q, q, q, positions=swapped, **kw))
    pos = torch.arange(12) + 12 * rank
    expect("'hash' differs", lambda: plsh(q, q, q, positions=pos, **{**kw, "seed": rank}))
    expect("'window' differs", lambda: alibi(q, q, q, slopes=alibi_slopes(2), positions=pos,
                                                          window=5 + rank))
    expect("'window' differs", lambda: alibi(q, q, q, slopes=alibi_slopes(2), positions=pos,
                                                          window=torch.tensor([3, 5 + rank])))
    whole = 12 * world
    cu = torch.tensor([0, 5 + rank, whole])  # a document layout that differs between ranks
    expect("'documents' differs", lambda: plsh(q, q, q, positions=pos, cu_seqlens=cu, **kw))
    expect("cu_seqlens must start at 0 and end at batch * seqlen",
           lambda: alibi(q, q, q, slopes=alibi_slopes(2), positions=pos,
                                      cu_seqlens=torch.tensor([0, 12])))
    rows = torch.stack([pos, pos + 1])
    expect("equal for every batch row", lambda: plsh(q.expand(2, -1, -1, -1), q.expand(2, -1, -1, -1),
                                                                  q.expand(2, -1, -1, -1), positions=rows, **kw))


# Documents of the two rows (lengths sum to T = 240): a 1-token document, documents longer
# than a chunk at every world size, and starts at 60 and 120 (chunk starts at P = 2, 3, 4).
DOC_LENGTHS = ([1, 59, 100, 80], [60, 60, 120])


def _doc_cu() -> torch.Tensor:
    offsets = [0]
    for row in DOC_LENGTHS:
        for n in row:
            offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32)


def _doc_of(row: int) -> torch.Tensor:
    """Document index of every token of ``row``, LongTensor[T]."""
    return torch.repeat_interleave(torch.arange(len(DOC_LENGTHS[row])), torch.tensor(DOC_LENGTHS[row]))


def _check_document_halo(stats, lsh, offset, causal, dtype, group):
    """Bytes received = the (row, head, position) triples sharing a document-cut block with the chunk."""
    P, r = dist.get_world_size(group), dist.get_rank(group)
    buckets = lsh.buckets(torch.arange(T) + offset)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    pairs = 0
    for b in range(B):
        doc = _doc_of(b)
        # a document cut: combine bucket and document into one id per token
        cut = buckets * (T + 1) + doc
        pairs += sum(len(n) for n in needed_pairs(cut, r, P, causal))
    expected = pairs * D * itemsize * 2
    assert stats["fwd_recv_bytes"] == expected, (r, stats, expected)
    assert stats["bwd_sent_bytes"] == expected, (r, stats, expected)
    Tl = T // P
    starts_everywhere = all(r * Tl in [0, *torch.tensor(DOC_LENGTHS[b]).cumsum(0).tolist()] for b in range(B))
    if causal and starts_everywhere:
        assert stats["fwd_recv_bytes"] == 0, (r, stats)  # the chunk starts a document in every row
    return starts_everywhere
    return expected


def document_cases(rank: int, world: int, group) -> None:
    """Packed documents crossing rank boundaries: every mode equals the single process with the
    same offsets; halos carry no key of an earlier document."""
    cu = _doc_cu()
    sigma = torch.tensor([0.7, 3.0, 25.0, 120.0], dtype=torch.float64)
    for method in ("per_sample", "onepass"):
        for causal, s in ((True, 4), (False, 3)):
            stats = _run_and_compare(plsh_attention, torch.float64, 8, 500, group, sigma=sigma, num_samples=s,
                                     seed=3, causal=causal, method=method, cu_seqlens=cu)
            starts = _check_document_halo(stats, PositionalLSH(sigma, s, 3), 500, causal, torch.float64, group)
            if causal and rank > 0 and not starts:
                assert stats["fwd_recv_bytes"] > 0, stats  # the document crosses into this chunk: a real halo
        stats = _run_and_compare(plsh_attention, torch.float64, 9, 0, group, sigma=40.0, num_samples=2, seed=1,
                                 method=method, cu_seqlens=cu)
        _check_document_halo(stats, PositionalLSH(40.0, 2, 1), 0, True, torch.float64, group)
    _run_and_compare(fixed_blocks_attention, torch.float64, 10, 0, group, sigma=50.0, cu_seqlens=cu)
    slopes = alibi_slopes(HQ) / 4
    for causal in (True, False):
        _run_and_compare(alibi_attention, torch.float64, 11, 30, group, slopes=slopes, causal=causal, cu_seqlens=cu)
        _run_and_compare(alibi_attention, torch.float64, 12, 30, group, slopes=slopes, causal=causal, window=70,
                         cu_seqlens=cu)
        _run_and_compare(alibi_attention, torch.float64, 12, 30, group, slopes=slopes, causal=causal,
                         window=torch.tensor([9, 70, 3, 9]), cu_seqlens=cu)
    _run_and_compare(causal_attention, torch.float64, 13, 0, group, cu_seqlens=cu)


CASES = {"plsh": plsh_cases, "alibi": alibi_cases, "errors": error_cases, "documents": document_cases}
