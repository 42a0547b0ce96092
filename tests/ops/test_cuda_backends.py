"""CUDA backends of plsh_attention against the dense fp64 reference (skipped without CUDA).

Rule (flash-attention's, tests/tolerances.py): a low-precision kernel may err
at most 2x what a same-dtype PyTorch computation of
the same estimator errs, for out, dq, dk and dv. The baseline is SDPA in that dtype with the float
mask ``log M~`` (the same masks, as a dense bias); the reference is the dense
fp64 attention with weights ``M~``. Both CUDA providers are checked: PyTorch's
own varlen flash kernels (``backend="torch"``) and flash-attn when installed.
"""

import warnings

import pytest
import torch

from plsh_dist.hashing import PositionalLSH, alibi_slopes
from plsh_dist.ops import plsh_attention
from plsh_dist.ops.reference import dense_attention
from tests.tolerances import BF16_FACTOR

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

B, T, HQ, HKV, D, S = 2, 1000, 8, 2, 64, 4
# Absolute slack for errors that are ~0 in both (e.g. a head whose blocks are
# all single tokens): a few bf16 ulps of O(1) values.
SLACK = 1e-3


def _flash_attn_or_skip(backend: str) -> None:
    from plsh_dist.ops.backends import flash_attn_available

    if backend == "flash_attn" and not flash_attn_available(torch.device("cuda"), torch.bfloat16):
        pytest.skip("flash-attn not installed")


def _inputs(dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda H: torch.randn(B, T, H, D, generator=g, device="cuda", dtype=torch.float64)
    return make(HQ), make(HKV), make(HKV)


def _sdpa_baseline(q, k, v, weights):
    """Same-dtype PyTorch computation: SDPA with bias log(M~) (and -inf above the diagonal)."""
    g = HQ // HKV
    causal = torch.ones(T, T, dtype=torch.bool, device="cuda").tril()
    bias = torch.log(weights).masked_fill(~causal, float("-inf")).to(q.dtype)  # (Hq or 1, T, T)
    qh, kh, vh = q.transpose(1, 2), k.repeat_interleave(g, 2).transpose(1, 2), v.repeat_interleave(g, 2).transpose(1, 2)
    return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias[None]).transpose(1, 2)


def _errors(fn, q64, k64, v64, dtype, dout64):
    """Max |error| of fn's output and of each gradient against the fp64 reference."""
    xs = [x.detach().to(dtype).requires_grad_() for x in (q64, k64, v64)]
    out = fn(*xs)
    grads = torch.autograd.grad(out, xs, dout64.to(dtype))
    return out, grads


@pytest.mark.parametrize("backend,method", [("torch", "per_sample"), ("flash_attn", "per_sample"),
                                            ("torch", "onepass")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("per_head", [True, False], ids=["per_head_sigma", "shared_sigma"])
def test_low_precision_error_is_bounded_by_the_same_dtype_baseline(backend, method, dtype, per_head):
    """Per sample on the varlen kernels; one pass (explicit matmuls on CUDA, bias log c in the
    inputs' dtype, as the baseline's log M~)."""
    _flash_attn_or_skip(backend)
    sigma = alibi_slopes(HQ).reciprocal() * 4 if per_head else 16.0
    positions = torch.arange(T) + 5000
    lsh = PositionalLSH(sigma, S, seed=7)
    weights = lsh.averaged_mask(positions).cuda()  # (H, T, T) float64

    q64, k64, v64 = (x.requires_grad_() for x in _inputs(dtype))
    ref = dense_attention(q64, k64, v64, weights, causal=True)
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout)

    op = lambda q, k, v: plsh_attention(q, k, v, sigma=sigma, num_samples=S, seed=7, positions=positions,
                                        backend=backend, method=method)
    out, grads = _errors(op, q64, k64, v64, dtype, dout)
    base, base_grads = _errors(lambda q, k, v: _sdpa_baseline(q, k, v, weights), q64, k64, v64, dtype, dout)

    err = (out.double() - ref).abs().max().item()
    base_err = (base.double() - ref).abs().max().item()
    assert out.dtype == dtype and err <= BF16_FACTOR * base_err + SLACK, (err, base_err)
    for name, g, bg, rg in zip("qkv", grads, base_grads, ref_grads):
        g_err = (g.double() - rg).abs().max().item()
        b_err = (bg.double() - rg).abs().max().item()
        assert g_err <= BF16_FACTOR * b_err + SLACK, (f"d{name}", g_err, b_err)


def test_backward_never_waits_for_the_gpu():
    """The forward syncs once (its block starts come back to the host); the backward reuses
    what the forward saved, so PyTorch's sync debugger sees no synchronising call in it."""
    sigma = alibi_slopes(HQ).reciprocal()
    q, k, v = (x.to(torch.bfloat16).requires_grad_() for x in _inputs(torch.bfloat16, seed=1))
    positions = torch.arange(T)
    out = plsh_attention(q, k, v, sigma=sigma, num_samples=S, seed=0, positions=positions, backend="torch")
    dout = torch.randn_like(out)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plsh_attention(q, k, v, sigma=sigma, num_samples=S, seed=0, positions=positions, backend="torch")
            forward_syncs = sum("synchroniz" in str(w.message) for w in caught)
            caught.clear()
            torch.autograd.grad(out, (q, k, v), dout)
            backward_syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert backward_syncs == []
    assert forward_syncs <= 2, forward_syncs  # nonzero + the copy of the block starts


def test_one_varlen_call_per_sample(monkeypatch):
    """All heads (per-head sigma) and batch rows go to the GPU in one call per sample."""
    from plsh_dist.ops.varlen import strategy as plsh_varlen

    calls = []
    real = plsh_varlen.varlen_fwd
    monkeypatch.setattr(plsh_varlen, "varlen_fwd", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = (x.to(torch.bfloat16) for x in _inputs(torch.bfloat16, seed=2))
    plsh_attention(q, k, v, sigma=alibi_slopes(HQ).reciprocal(), num_samples=S, seed=0, backend="torch")
    assert len(calls) == S
