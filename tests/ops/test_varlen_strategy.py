"""The CUDA varlen strategy (row layouts, per-sample calls, chunking, merging) on CPU.

The kernels are swapped for ``VarlenKernel.REFERENCE`` (padded explicit matmuls), so everything around the flash-attention calls is checked here
against the dense fp64 reference; the kernels themselves are checked on a GPU
(tests/ops/test_cuda_backends.py).
"""

import pytest
import torch

from plsh_dist.hashing import PositionalLSH, alibi_slopes
from plsh_dist.ops.backends import VARLEN_REFERENCE, choose_strategy
from plsh_dist.ops.plsh import PLSHAttentionFunction
from plsh_dist.ops.varlen.calls import varlen_calls
from tests.ops.test_plsh_attention import _check_against_reference, _qkv


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("max_seqs", [None, 7])
def test_varlen_strategy_matches_dense_reference(causal, per_head, max_seqs, monkeypatch):
    Hq, Hkv, T = 4, 2, 90
    q, k, v = _qkv(2, T, Hq, Hkv, 8, torch.float64, seed=5)
    sigma = alibi_slopes(Hq).reciprocal() * 2 if per_head else 6.0
    lsh = PositionalLSH(sigma, 3, seed=11)
    positions = torch.arange(T) * 2 + 1000  # gapped and offset
    if max_seqs:  # cut every sample into many calls of <= 7 blocks
        monkeypatch.setattr("plsh_dist.ops.varlen.calls.MAX_SEQS_PER_CALL", max_seqs)
        assert len(varlen_calls(lsh, positions, 2, torch.device("cpu"))[0]) > 3
    out = PLSHAttentionFunction.apply(q, k, v, lsh, positions, causal, 8**-0.5, VARLEN_REFERENCE)[0]
    _check_against_reference(q, k, v, out, lsh.averaged_mask(positions), causal)


def test_varlen_strategy_equals_padded_strategy_in_fp32():
    """Same blocks, different kernels and layouts: agree to fp32 rounding."""
    q, k, v = _qkv(1, 300, 8, 2, 16, torch.float32, seed=2)
    lsh = PositionalLSH(alibi_slopes(8).reciprocal(), 4, seed=3)
    pos = torch.arange(300)
    a, la, _ = VARLEN_REFERENCE.forward(q, k, v, lsh, pos, causal=True, scale=0.25)
    padded = choose_strategy("torch", "per_sample", q.device, q.dtype, lsh.num_samples)
    b, lb, _ = padded.forward(q, k, v, lsh, pos, causal=True, scale=0.25)
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)  # fp32 sums in another order
    torch.testing.assert_close(la, lb, atol=2e-5, rtol=2e-5)


def test_chunks_cover_rows_and_respect_the_sequence_cap():
    lsh = PositionalLSH(torch.tensor([1.5, 3.0, 50.0]), 2, seed=0)
    pos = torch.arange(500)
    B = 3
    for t, chunks in enumerate(varlen_calls(lsh, pos, B, torch.device("cpu"), max_seqs=40)):
        assert chunks[0].row_start == 0 and chunks[-1].row_end == 3 * B * 500
        for c, nxt in zip(chunks, chunks[1:]):
            assert c.row_end == nxt.row_start
        starts = []
        for c in chunks:
            cu = c.cu_seqlens.long()
            assert cu.numel() - 1 <= 40 and int(cu[0]) == 0 and int(cu[-1]) == c.row_end - c.row_start
            assert c.max_len == int((cu[1:] - cu[:-1]).max())
            starts += (cu[:-1] + c.row_start).tolist()
        # the blocks are exactly the hash's: rows (h, b, i) start where a bucket starts
        buckets = lsh.sample_buckets(pos, t)
        expected = [(h * B + b) * 500 + i for h in range(3) for b in range(B) for i in range(500)
                    if i == 0 or buckets[h, i] != buckets[h, i - 1]]
        assert starts == expected
