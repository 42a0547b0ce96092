"""Shared pieces of the Triton kernel's tests: brute-force counts from the hash and the
dense fp64 reference with gradients.

Legend: B batch, n tokens, Hq / Hkv query / key-value heads, D head dim, Hh bias heads.
"""

from __future__ import annotations

import pytest
import torch

from plsh_dist.ops.documents import Documents
from plsh_dist.ops.gqa import repeat_kv


def brute_counts(lsh, positions: torch.Tensor, causal: bool, docs: Documents | None = None) -> torch.Tensor:
    """``c_ij = #{t : bucket_t(p_i) == bucket_t(p_j)}`` from ``PositionalLSH.buckets``, int32 (Hh, n, n),
    0 for j > i (causal) and across documents."""
    pos = positions if docs is None else docs.positions
    b = lsh.buckets(pos)  # (s, Hh, n)
    counts = (b[:, :, :, None] == b[:, :, None, :]).sum(0).to(torch.int32)
    return counts * _seen(pos.numel(), causal, docs).to(torch.int32)


def _seen(n: int, causal: bool, docs: Documents | None) -> torch.Tensor:
    """Bool (n, n): key j is seen by query i (j <= i when causal; the same document)."""
    seen = torch.ones(n, n, dtype=torch.bool)
    if causal:
        seen = seen.tril()
    if docs is not None:
        seen = seen & (docs.ids[:, None] == docs.ids[None, :])
    return seen


def window_weights(sigma: torch.Tensor, window: torch.Tensor, positions: torch.Tensor, causal: bool,
                   docs: Documents | None = None) -> torch.Tensor:
    """Exact ALiBi weights ``exp(-|p_i - p_j| / sigma_h)`` inside ``|p_i - p_j| < window_h``, float64 (H, n, n)."""
    pos = (positions if docs is None else docs.positions).to(torch.float64)
    dist = (pos[:, None] - pos[None, :]).abs()
    w = torch.exp(-dist[None] / sigma.double()[:, None, None]) * (dist[None] < window.double()[:, None, None])
    return w * _seen(pos.numel(), causal, docs).to(torch.float64)


def dense_reference(q, k, v, weights: torch.Tensor, scale: float, dout: torch.Tensor):
    """fp64 ``softmax(q k^T scale + log W) v``: out (B, n, Hq, D), lse (B, Hq, n), dq, dk, dv.

    ``weights``: (Hh, n, n) non-negative (0 = hidden), Hh = 1 or Hq; any positive
    multiple of W gives the same out (the count c = s M~ here), lse includes it.
    """
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    logits = torch.einsum("bihd,bjhd->bhij", q64, repeat_kv(k64, g)) * scale + weights.double().log()[None]
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.einsum("bhij,bjhd->bihd", torch.exp(logits - lse[..., None]), repeat_kv(v64, g))
    dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), dout.double())
    return out.detach(), lse.detach(), dq, dk, dv


def random_qkv(B: int, n: int, Hq: int, Hkv: int, D: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, h, D, generator=g).to(dtype) for h in (Hq, Hkv, Hkv))
    dout = torch.randn(B, n, Hq, D, generator=g).to(dtype)
    return q, k, v, dout


def kernel_device() -> torch.device:
    """Where the kernel runs in these tests: the CPU under Triton's interpreter (``tests/conftest.py``
    switches it on where there is no CUDA), else the GPU (the compiled kernel: ``make gpu-check``)."""
    from plsh_dist.ops.triton.attention import interpreting

    if interpreting():
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip("the Triton kernel needs CUDA, or TRITON_INTERPRET=1 set before triton is imported")
