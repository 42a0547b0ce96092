"""Decoding ops (plsh_dist.ops.decode): each query against its cached prefix equals
the full causal op's row, per mode, in fp64 (1e-10), with GQA and per-head or
shared sigma; a multi-query step (chunked prefill) as well; bad input is refused."""

import pytest
import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes
from plsh_dist.ops import alibi_attention, causal_attention, fixed_blocks_attention, plsh_attention
from plsh_dist.ops.decode import alibi_decode, block_decode, causal_decode
from tests.tolerances import FP64

B, HQ, HKV, D, T = 2, 4, 2, 8, 70
POS = torch.arange(T) * 2 + 5  # an offset and gaps: the hash sees positions, the kernels token order


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, T, h, D, generator=g, dtype=torch.float64) for h in (HQ, HKV, HKV))


def _sigma(per_head: bool):
    return alibi_slopes(HQ).reciprocal().double() * 2 if per_head else 6.5  # 2 .. 512: bands past the start


def _assert_rows(decode, full, q, k, v):
    """Every query alone against its prefix, and the last 9 queries in one step."""
    for i in range(T):
        got = decode(q[:, i : i + 1], k[:, : i + 1], v[:, : i + 1], POS[i : i + 1], POS[: i + 1])
        torch.testing.assert_close(got, full[:, i : i + 1], **FP64, msg=f"query {i}")
    got = decode(q[:, -9:], k, v, POS[-9:], POS)
    torch.testing.assert_close(got, full[:, -9:], **FP64)


@pytest.mark.parametrize("s", [1, 3, 8])
@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "shared"])
@pytest.mark.parametrize("method", ["onepass", "per_sample"])
def test_plsh_decode_equals_full_forward(s, per_head, method):
    q, k, v = _qkv(s)
    sigma, seed, sampler = _sigma(per_head), 100 + s, "stratified" if s == 3 else "iid"
    full = plsh_attention(q, k, v, sigma=sigma, num_samples=s, seed=seed, positions=POS, sampler=sampler,
                          method=method)
    lsh = PositionalLSH(sigma, s, seed, sampler)
    _assert_rows(lambda *a: block_decode(*a, lsh), full, q, k, v)


@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "shared"])
def test_fixed_blocks_decode_equals_full_forward(per_head):
    q, k, v = _qkv(7)
    sigma = _sigma(per_head)
    full = fixed_blocks_attention(q, k, v, sigma=sigma, positions=POS)
    _assert_rows(lambda *a: block_decode(*a, FixedBlocks(sigma)), full, q, k, v)


@pytest.mark.parametrize("window", [None, 9, (4, 30, 9, 9)], ids=["exact", "window", "per_head"])
def test_alibi_decode_equals_full_forward(window):
    q, k, v = _qkv(3)
    slopes = alibi_slopes(HQ)
    full = alibi_attention(q, k, v, slopes=slopes, positions=POS, window=window)
    _assert_rows(lambda *a: alibi_decode(*a, slopes=slopes, window=window), full, q, k, v)


def test_causal_decode_equals_full_forward():
    q, k, v = _qkv(4)
    _assert_rows(causal_decode, causal_attention(q, k, v, positions=POS), q, k, v)


def test_scale_is_honoured():
    q, k, v = _qkv(5)
    lsh = PositionalLSH(6.5, 3, 1)
    full = plsh_attention(q, k, v, sigma=6.5, num_samples=3, seed=1, positions=POS, softmax_scale=0.3)
    torch.testing.assert_close(block_decode(q[:, -1:], k, v, POS[-1:], POS, lsh, scale=0.3), full[:, -1:], **FP64)


def test_bad_input_is_refused():
    q, k, v = _qkv(6)
    lsh = PositionalLSH(6.5, 2, 0)
    with pytest.raises(ValueError, match="every query position must also be a key position"):
        block_decode(q[:, -1:], k[:, :-1], v[:, :-1], POS[-1:], POS[:-1], lsh)
    with pytest.raises(ValueError, match="strictly increasing"):
        alibi_decode(q[:, :2], k[:, :2], v[:, :2], POS[:2].flip(0), POS[:2], slopes=alibi_slopes(HQ))
    with pytest.raises(ValueError, match="one position per"):
        causal_decode(q[:, -1:], k, v, POS[-2:], POS)
    with pytest.raises(ValueError, match="sigma must be a float or a Tensor"):
        block_decode(q[:, -1:], k, v, POS[-1:], POS, PositionalLSH(torch.ones(3), 2, 0))
