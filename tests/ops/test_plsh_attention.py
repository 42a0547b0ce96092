"""plsh_attention against the dense fp64 reference with M~ from the same buckets."""

import pytest
import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes
from plsh_dist.ops import fixed_blocks_attention, plsh_attention
from plsh_dist.ops.merge import merge_into
from plsh_dist.ops.reference import dense_attention
from tests.tolerances import BF16_FACTOR, FP64, for_dtype


def _qkv(B, T, Hq, Hkv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda H: torch.randn(B, T, H, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return make(Hq), make(Hkv), make(Hkv)


def _check_against_reference(q, k, v, out, weights, causal):
    ref = dense_attention(q, k, v, weights, causal=causal)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads_ref = torch.autograd.grad(ref, (q, k, v), g)
    grads = torch.autograd.grad(out, (q, k, v), g.to(out.dtype))
    tol = for_dtype(q.dtype)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out.double(), ref, **tol)
    for name, a, b in zip("qkv", grads, grads_ref):
        torch.testing.assert_close(a.double(), b.double(), **tol, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T", [1, 97, 1025])
@pytest.mark.parametrize("per_head", [True, False])
def test_matches_dense_reference(dtype, causal, T, per_head):
    Hq, Hkv, D = 4, 2, 8
    s = {1: 3, 97: 8, 1025: 1}[T]
    q, k, v = _qkv(2 if T < 1000 else 1, T, Hq, Hkv, D, dtype)
    sigma = alibi_slopes(Hq).reciprocal() * 2 if per_head else 5.0
    positions = torch.arange(T) + (0 if T == 97 else 123_457)
    out = plsh_attention(q, k, v, sigma=sigma, num_samples=s, seed=42, positions=positions, causal=causal)
    weights = PositionalLSH(sigma, s, 42).averaged_mask(positions)
    _check_against_reference(q, k, v, out, weights, causal)


@pytest.mark.parametrize("backend", ["torch", "math"])
@pytest.mark.parametrize("s", [1, 3, 8])
def test_backends_and_sample_counts(backend, s):
    q, k, v = _qkv(2, 150, 6, 3, 16, torch.float64, seed=s)
    sigma = torch.tensor([0.8, 2.0, 9.0, 40.0, 64.0, 300.0])
    positions = torch.arange(150) * 3 + 7  # gapped positions are allowed
    out = plsh_attention(q, k, v, sigma=sigma, num_samples=s, seed=s, positions=positions, backend=backend)
    weights = PositionalLSH(sigma, s, s).averaged_mask(positions)
    _check_against_reference(q, k, v, out, weights, causal=True)


def test_fixed_blocks_matches_reference():
    q, k, v = _qkv(1, 80, 2, 1, 8, torch.float64)
    out = fixed_blocks_attention(q, k, v, sigma=torch.tensor([3.0, 7.5]))
    weights = FixedBlocks(torch.tensor([3.0, 7.5])).averaged_mask(torch.arange(80))
    _check_against_reference(q, k, v, out, weights, causal=True)


def test_tiny_sigma_attends_to_self_only():
    q, k, v = _qkv(1, 64, 2, 2, 8, torch.float64)
    out = plsh_attention(q, k, v, sigma=1e-6, num_samples=4, seed=0)
    torch.testing.assert_close(out, v.detach(), **FP64)  # exp(0) weights merge exactly up to ulps


def test_huge_sigma_is_plain_causal_attention():
    q, k, v = _qkv(1, 64, 4, 2, 8, torch.float64)
    out = plsh_attention(q, k, v, sigma=1e9, num_samples=2, seed=0)
    torch.testing.assert_close(out, dense_attention(q, k, v, causal=True), atol=1e-12, rtol=1e-12)


def test_samples_merge_by_lse_not_by_averaging_normalised_outputs():
    """The estimator sums numerators and denominators over samples."""
    T, s = 120, 4
    q, k, v = _qkv(1, T, 1, 1, 8, torch.float64, seed=3)
    lsh = PositionalLSH(6.0, s, seed=8)
    out = plsh_attention(q, k, v, sigma=6.0, num_samples=s, seed=8)
    b = lsh.buckets(torch.arange(T))
    per_sample = [dense_attention(q, k, v, (b[t, 0][:, None] == b[t, 0][None, :]).double()[None]) for t in range(s)]
    averaged = torch.stack(per_sample).mean(0)
    correct = dense_attention(q, k, v, lsh.averaged_mask(torch.arange(T)))
    torch.testing.assert_close(out, correct, atol=1e-12, rtol=1e-12)
    assert (out - averaged).abs().max() > 1e-3, "averaging normalised outputs must differ from the estimator"


def test_merge_into_is_logsumexp_weighting():
    g = torch.Generator().manual_seed(0)
    o1, o2 = torch.randn(2, 5, 3, 4, generator=g), torch.randn(2, 5, 3, 4, generator=g)
    l1, l2 = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    out, lse = merge_into(None, None, o1, l1)
    out, lse = merge_into(out, lse, o2, l2)
    lse_ref = torch.logaddexp(l1, l2)
    w1 = torch.exp(l1 - lse_ref).transpose(1, 2)[..., None]
    w2 = torch.exp(l2 - lse_ref).transpose(1, 2)[..., None]
    torch.testing.assert_close(lse, lse_ref)
    torch.testing.assert_close(out, w1 * o1 + w2 * o2)
    assert not torch.equal(o1, out), "the first part must be copied, not aliased"


def test_saved_memory_does_not_grow_with_samples():
    def saved_bytes(s):
        q, k, v = _qkv(1, 256, 4, 2, 16, torch.float32)
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            plsh_attention(q, k, v, sigma=alibi_slopes(4).reciprocal(), num_samples=s, seed=0)
        return total

    b1, b16 = saved_bytes(1), saved_bytes(16)
    assert b1 == b16
    # q, k, v, out (fp32) and lse: nothing per sample
    assert b16 == 4 * (256 * 4 * 16 + 2 * 256 * 2 * 16 + 256 * 4 * 16) + 4 * 4 * 256


def test_no_grad_saves_nothing_and_matches():
    q, k, v = _qkv(1, 50, 2, 2, 8, torch.float32)
    with torch.no_grad():
        a = plsh_attention(q, k, v, sigma=4.0, num_samples=3, seed=1)
    b = plsh_attention(q, k, v, sigma=4.0, num_samples=3, seed=1)
    assert torch.equal(a, b.detach())


def test_bf16_error_is_bounded_by_the_same_dtype_baseline():
    """bf16 may err at most 2x what a bf16 PyTorch computation of the same estimator errs (output only;
    every mode, output and gradients: tests/ops/test_bf16_rule.py)."""
    q, k, v = _qkv(1, 200, 2, 2, 16, torch.float64)
    lsh_weights = PositionalLSH(8.0, 4, 3).averaged_mask(torch.arange(200))
    ref = dense_attention(q, k, v, lsh_weights)
    qb, kb, vb = (x.detach().to(torch.bfloat16) for x in (q, k, v))
    out = plsh_attention(qb, kb, vb, sigma=8.0, num_samples=4, seed=3)
    # baseline: the same math in bf16 through PyTorch SDPA with a float mask
    bias = torch.log(lsh_weights).to(torch.bfloat16).expand(1, 2, 200, 200).tril()
    bias = bias.masked_fill(torch.ones(200, 200, dtype=torch.bool).triu(1), float("-inf"))
    base = torch.nn.functional.scaled_dot_product_attention(
        qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), attn_mask=bias
    ).transpose(1, 2)
    err = (out.double() - ref).abs().max()
    base_err = (base.double() - ref).abs().max()
    assert err <= BF16_FACTOR * base_err + 1e-6, (err, base_err)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(sigma=0.0), "sigma"),
        (dict(sigma=-3.0), "sigma"),
        (dict(num_samples=0), "num_samples"),
        (dict(sigma=torch.ones(3)), "sigma"),
        (dict(positions=torch.arange(5)), "positions"),
        (dict(positions=torch.arange(16).flip(0)), "increasing"),
        (dict(backend="cuda-magic"), "backend"),
        (dict(softmax_scale=-1.0), "softmax_scale"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    q, k, v = _qkv(1, 16, 4, 2, 8, torch.float32)
    args = dict(sigma=2.0, num_samples=2, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        plsh_attention(q, k, v, **args)


def test_bad_shapes_raise_clear_errors():
    q, k, v = _qkv(1, 16, 4, 3, 8, torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        plsh_attention(q, k, v, sigma=2.0, num_samples=1, seed=0)
    q, k, v = _qkv(1, 16, 4, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="same shape"):
        plsh_attention(q, k, v[:, :8], sigma=2.0, num_samples=1, seed=0)
    with pytest.raises(ValueError, match="agree"):
        plsh_attention(q[:, :8], k, v, sigma=2.0, num_samples=1, seed=0)
    with pytest.raises(ValueError, match="head_dim"):
        plsh_attention(q[0], k, v, sigma=2.0, num_samples=1, seed=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["torch", "flash_attn"])
def test_cuda_backends_match_math_path(backend):
    from plsh_dist.ops.backends import flash_attn_available

    if backend == "flash_attn" and not flash_attn_available(torch.device("cuda"), torch.bfloat16):
        pytest.skip("flash-attn not installed")
    q, k, v = (x.detach().cuda().to(torch.bfloat16).requires_grad_() for x in _qkv(2, 1000, 8, 4, 64, torch.float32))
    sigma = alibi_slopes(8).reciprocal()
    out = plsh_attention(q, k, v, sigma=sigma, num_samples=4, seed=0, backend=backend)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = plsh_attention(q64, k64, v64, sigma=sigma, num_samples=4, seed=0, backend="math")
    base = plsh_attention(*(x.detach().requires_grad_() for x in (q, k, v)), sigma=sigma, num_samples=4, seed=0, backend="math")
    assert (out.double() - ref).abs().max() <= 2 * (base.double() - ref).abs().max() + 1e-3
    g = torch.randn_like(ref)
    ga = torch.autograd.grad(out, (q, k, v), g.to(out.dtype))
    gr = torch.autograd.grad(ref, (q64, k64, v64), g)
    for a, b in zip(ga, gr):
        assert (a.double() - b).abs().max() <= 3e-2 * b.abs().max() + 1e-3
