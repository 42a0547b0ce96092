"""A (B, H, T, D) tensor where (B, T, H, D) is expected is refused with the layout named,
where the shapes allow a check: positions' length against q.shape[1]."""

from __future__ import annotations

import pytest
import torch

from plsh_dist.hashing import alibi_slopes
from plsh_dist.ops import alibi_attention, plsh_attention


def _bhtd(heads=4, seqlen=16):
    """(B, H, T, D) tensors whose head count equals the KV head count (GQA accepts them)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, heads, seqlen, 8, generator=g) for _ in range(3)]


@pytest.mark.parametrize("positions_shape", ["1d", "2d"])
@pytest.mark.parametrize("op", ["plsh", "alibi"])
def test_heads_first_layout_is_refused_naming_the_layout(op, positions_shape):
    q, k, v = _bhtd()
    positions = torch.arange(16) if positions_shape == "1d" else torch.arange(16).expand(2, 16)
    with pytest.raises(ValueError) as err:
        if op == "plsh":
            plsh_attention(q, k, v, sigma=4.0, num_samples=2, seed=0, positions=positions)
        else:
            alibi_attention(q, k, v, slopes=alibi_slopes(16), positions=positions)
    msg = str(err.value)
    assert "positions has 16 positions but q.shape[1] (seqlen) is 4" in msg
    assert "(batch, heads, seqlen, head_dim)" in msg and "q.transpose(1, 2)" in msg


def test_the_right_layout_still_passes():
    q, k, v = (x.transpose(1, 2) for x in _bhtd())
    out = plsh_attention(q, k, v, sigma=4.0, num_samples=2, seed=0, positions=torch.arange(16))
    assert out.shape == q.shape


def test_heads_first_layout_is_refused_by_cu_seqlens():
    """cu_seqlens covers batch * seqlen tokens: a heads-first tensor makes seqlen the head count."""
    q, k, v = _bhtd()
    cu_seqlens = torch.tensor([0, 10, 16, 32], dtype=torch.int32)  # two rows of 16 tokens
    with pytest.raises(ValueError) as err:
        plsh_attention(q, k, v, sigma=4.0, num_samples=2, seed=0, cu_seqlens=cu_seqlens)
    msg = str(err.value)
    assert "cu_seqlens must start at 0 and end at batch * seqlen" in msg and "q.transpose(1, 2)" in msg


def test_heads_first_layout_is_refused_by_per_head_sigma():
    """One sigma per query head: a heads-first tensor reads seqlen (16) as the head count (4 sigmas)."""
    q, k, v = _bhtd()
    with pytest.raises(ValueError) as err:
        plsh_attention(q, k, v, sigma=1.0 / alibi_slopes(4), num_samples=2, seed=0)
    msg = str(err.value)
    assert "Tensor[Hq] with Hq=16 entries, got 4 entries" in msg and "q.transpose(1, 2)" in msg
