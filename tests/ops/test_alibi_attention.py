"""Exact ALiBi (chunked, optionally windowed) and the no-bias baseline against dense fp64."""

import pytest
import torch

from plsh_dist.hashing import alibi_slopes
from plsh_dist.ops import alibi_attention, causal_attention
from plsh_dist.ops.alibi import default_chunk_size
from plsh_dist.ops.reference import alibi_weights, dense_attention
from tests.tolerances import for_dtype


def _qkv(B, T, Hq, Hkv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda H: torch.randn(B, T, H, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return make(Hq), make(Hkv), make(Hkv)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 9])
@pytest.mark.parametrize("chunk", [None, 16])
def test_alibi_matches_dense_reference(dtype, causal, window, chunk):
    Hq, T = 4, 97
    q, k, v = _qkv(2, T, Hq, 2, 8, dtype)
    slopes = alibi_slopes(Hq)
    positions = torch.arange(T) + 10**6
    out = alibi_attention(q, k, v, slopes=slopes, positions=positions, causal=causal, window=window, chunk_size=chunk)
    ref = dense_attention(q, k, v, alibi_weights(slopes, positions, window), causal=causal)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    tol = for_dtype(dtype)
    torch.testing.assert_close(out.double(), ref, **tol)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g.to(dtype)), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a.double(), b.double(), **tol)


def test_window_one_is_self_attention():
    q, k, v = _qkv(1, 30, 2, 2, 8, torch.float64)
    out = alibi_attention(q, k, v, slopes=alibi_slopes(2), window=1)
    torch.testing.assert_close(out, v.detach(), atol=1e-15, rtol=0)


def test_gapped_positions_use_position_distance():
    q, k, v = _qkv(1, 40, 2, 1, 8, torch.float64)
    positions = torch.arange(40) ** 2
    out = alibi_attention(q, k, v, slopes=alibi_slopes(2), positions=positions, window=50, chunk_size=8)
    ref = dense_attention(q, k, v, alibi_weights(alibi_slopes(2), positions, 50))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)


def test_chunk_size_bounds_memory():
    assert default_chunk_size(8, 65536) * 8 * 65536 * 4 <= 64 * 2**20
    assert default_chunk_size(1, 10) == 1024
    assert default_chunk_size(64, 10**7) == 16


@pytest.mark.parametrize("causal", [True, False])
def test_causal_attention_matches_reference(causal):
    q, k, v = _qkv(2, 70, 4, 2, 8, torch.float64)
    out = causal_attention(q, k, v, causal=causal)
    ref = dense_attention(q, k, v, causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(slopes=torch.ones(3)), "slopes"),
        (dict(slopes=-torch.ones(4)), "slopes"),
        (dict(window=0), "window"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(positions=torch.arange(3)), "positions"),
    ],
)
def test_bad_arguments(kwargs, match):
    q, k, v = _qkv(1, 12, 4, 2, 8, torch.float32)
    args = dict(slopes=alibi_slopes(4)) | kwargs
    with pytest.raises(ValueError, match=match):
        alibi_attention(q, k, v, **args)
