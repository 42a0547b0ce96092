"""Exact ALiBi (chunked, optionally windowed) and the no-bias baseline against dense fp64."""

import pytest
import torch

from plsh_dist.hashing import alibi_slopes
from plsh_dist.ops import alibi_attention, causal_attention
from plsh_dist.ops.alibi import default_chunk_size, window_chunk_size
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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", [None, 16])
def test_per_head_windows_match_dense_reference(dtype, causal, chunk):
    """Truncated ALiBi: one window per head (two heads share one, GQA groups mix windows),
    outputs and gradients against the dense fp64 reference."""
    Hq, T = 4, 150
    q, k, v = _qkv(2, T, Hq, 2, 8, dtype, seed=3)
    slopes = alibi_slopes(Hq)
    window = torch.tensor([5, 70, 5, 23])
    positions = torch.arange(T) + 17
    out = alibi_attention(q, k, v, slopes=slopes, positions=positions, causal=causal, window=window, chunk_size=chunk)
    ref = dense_attention(q, k, v, alibi_weights(slopes, positions, window), causal=causal)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    tol = for_dtype(dtype)
    torch.testing.assert_close(out.double(), ref, **tol)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g.to(dtype)), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a.double(), b.double(), **tol)


def test_per_head_windows_equal_one_head_at_a_time():
    """Each head of a per-head call is the single-window call of that head (the same chunks)."""
    q, k, v = _qkv(1, 90, 4, 2, 8, torch.float64, seed=4)
    slopes, window = alibi_slopes(4), [3, 40, 12, 40]
    out, lse = alibi_attention(q, k, v, slopes=slopes, window=window, chunk_size=32, return_lse=True)
    for h in range(4):
        o, l = alibi_attention(q[:, :, h : h + 1], k[:, :, h // 2 : h // 2 + 1], v[:, :, h // 2 : h // 2 + 1],
                               slopes=slopes[h : h + 1], window=window[h], chunk_size=32, return_lse=True)
        assert torch.equal(out[:, :, h : h + 1], o) and torch.equal(lse[:, h : h + 1], l)
    # one window in every entry is the shared-window call
    same = alibi_attention(q, k, v, slopes=slopes, window=torch.full((4,), 12), chunk_size=32)
    assert torch.equal(same, alibi_attention(q, k, v, slopes=slopes, window=12, chunk_size=32))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("call_elements", [None, 5000])
def test_banded_interior_matches_dense_reference(causal, call_elements, monkeypatch):
    """Contiguous positions: the interior chunks run stacked (ops/alibi_band.py), the ends in the
    loop; one call or many (a tiny call budget), GQA, windows 1, 3, 40 and one wider than T."""
    from plsh_dist.ops import alibi_band

    if call_elements is not None:
        monkeypatch.setattr(alibi_band, "_CALL_ELEMENTS", call_elements)
    Hq, T = 4, 300
    q, k, v = _qkv(2, T, Hq, 2, 8, torch.float64, seed=8)
    slopes = alibi_slopes(Hq)
    window = torch.tensor([1, 3, 40, 400])
    assert alibi_band.interior_rows(T, 40, causal, alibi_band.band_chunk(40)) != (0, 0)  # the band is used
    out = alibi_attention(q, k, v, slopes=slopes, causal=causal, window=window)
    ref = dense_attention(q, k, v, alibi_weights(slopes, torch.arange(T), window), causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_interior_rows():
    from plsh_dist.ops.alibi_band import interior_rows

    # causal w = 10, C = 16: chunk 1 ([16, 32), keys from 7) is the first whose keys start >= 0
    assert interior_rows(100, 10, True, 16) == (16, 96)
    assert interior_rows(100, 10, False, 16) == (16, 80)  # keys up to i + 9 stay below 100
    assert interior_rows(20, 10, True, 16) == (0, 0)


def test_window_chunk_size():
    assert window_chunk_size(1, 8, 10**6) == 64
    assert window_chunk_size(1, 100, 10**6) == 112  # a multiple of 16 covering the window
    assert window_chunk_size(64, 4000, 10**7) * 64 * (window_chunk_size(64, 4000, 10**7) + 8000) * 4 <= 64 * 2**20


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
        (dict(window=torch.tensor([3, 4])), "one int >= 1 per query head"),
        (dict(window=torch.tensor([3, 0, 4, 4])), "one int >= 1 per query head"),
        (dict(window=torch.tensor([3.0, 4.0, 4.0, 4.0])), "integer"),
        (dict(window=2.5), "window"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(positions=torch.arange(3)), "positions"),
    ],
)
def test_bad_arguments(kwargs, match):
    q, k, v = _qkv(1, 12, 4, 2, 8, torch.float32)
    args = dict(slopes=alibi_slopes(4)) | kwargs
    with pytest.raises(ValueError, match=match):
        alibi_attention(q, k, v, **args)
