"""One-pass PLSH (integer weights c_ij) equals the per-sample merge and the dense
fp64 reference with M~, forward and all three gradients; its memory does not
grow with s; the method choice is validated."""

import pytest
import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes
from plsh_dist.ops import fixed_blocks_attention, plsh_attention
from plsh_dist.ops.cpu import onepass as plsh_onepass
from plsh_dist.ops.backends import choose_strategy
from plsh_dist.ops.reference import dense_attention
from tests.tolerances import FP32

B, HQ, HKV, D = 2, 4, 2, 8
REL64 = dict(atol=1e-12, rtol=1e-12)  # the 1e-12: fp64 sums in another order


def _qkv(T, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda H: torch.randn(B, T, H, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()  # noqa: E731
    return make(HQ), make(HKV), make(HKV), torch.randn(B, T, HQ, D, generator=g, dtype=torch.float64).to(dtype)


def _out_and_grads(fn, q, k, v, g, **kw):
    out = fn(q, k, v, **kw)
    return [out, *torch.autograd.grad(out, (q, k, v), g)]


def _sigma(per_head: bool):
    return alibi_slopes(HQ).reciprocal().double() * 3 if per_head else 6.5


CASES = [(T, s) for T in (1, 97, 1025) for s in (1, 3, 8, 64)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "shared"])
@pytest.mark.parametrize("T,s", CASES, ids=[f"T{T}-s{s}" for T, s in CASES])
def test_onepass_matches_dense_reference_and_per_sample(T, s, per_head, causal):
    sampler = "stratified" if s in (3, 64) else "iid"
    pos = torch.arange(T) * 2 + 37  # offset and gaps: the hash sees positions, the kernel token order
    sigma = _sigma(per_head)
    kw = dict(sigma=sigma, num_samples=s, seed=s + T, positions=pos, causal=causal, sampler=sampler)
    q, k, v, g = _qkv(T, seed=T + s)
    one = _out_and_grads(plsh_attention, q, k, v, g, method="onepass", **kw)
    per = _out_and_grads(plsh_attention, q, k, v, g, method="per_sample", **kw)
    for a, b in zip(one, per):
        torch.testing.assert_close(a, b, **REL64)
    weights = PositionalLSH(sigma, s, s + T, sampler).averaged_mask(pos)
    ref = _out_and_grads(lambda *x, **_: dense_attention(*x, weights, causal=causal), q, k, v, g)
    for a, b in zip(one, ref):
        torch.testing.assert_close(a, b, **REL64)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_long_sequence_matches_per_sample(causal):
    """T = 4099: several calls per head, a ragged last chunk, large and tiny sigma."""
    T = 4099
    sigma = torch.tensor([0.8, 4.0, 60.0, 700.0], dtype=torch.float64)
    q, k, v, g = _qkv(T, seed=7)
    kw = dict(sigma=sigma, num_samples=8, seed=2, causal=causal, positions=torch.arange(T) + 123)
    one = _out_and_grads(plsh_attention, q, k, v, g, method="onepass", **kw)
    per = _out_and_grads(plsh_attention, q, k, v, g, method="per_sample", **kw)
    for a, b in zip(one, per):
        torch.testing.assert_close(a, b, **REL64)


def test_fixed_blocks_onepass_matches_per_sample():
    q, k, v, g = _qkv(300, seed=3)
    sigma = torch.tensor([2.0, 5.0, 9.0, 40.0], dtype=torch.float64)
    for causal in (True, False):
        one = _out_and_grads(fixed_blocks_attention, q, k, v, g, sigma=sigma, causal=causal, method="onepass")
        ref = _out_and_grads(lambda *x, **_: dense_attention(*x, FixedBlocks(sigma).averaged_mask(torch.arange(300)),
                                                             causal=causal), q, k, v, g)
        for a, b in zip(one, ref):
            torch.testing.assert_close(a, b, **REL64)


@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "shared"])
def test_fp32_onepass_within_fp32_tolerance_of_fp64(per_head):
    """fp32 bias (log c from summed fp32 increments) and fp32 kernels: FP32 of tests/tolerances.py."""
    T, s = 700, 20
    q, k, v, g = _qkv(T, seed=11)
    kw = dict(sigma=_sigma(per_head), num_samples=s, seed=1, method="onepass")
    ref = _out_and_grads(plsh_attention, q, k, v, g, **kw)
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    got = _out_and_grads(plsh_attention, q32, k32, v32, g.float(), **kw)
    for a, b in zip(got, ref):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, **FP32)


def _saved_bytes(s: int) -> int:
    q, k, v, g = _qkv(400, dtype=torch.float32, seed=5)
    total = []
    pack = lambda x: total.append(x.numel() * x.element_size()) or x  # noqa: E731
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        plsh_attention(q, k, v, sigma=_sigma(True), num_samples=s, seed=0, method="onepass")
    return sum(total)


def test_saved_for_backward_does_not_grow_with_s():
    # q and out (B, T, Hq, D), k and v (B, T, Hkv, D), lse (B, Hq, T), fp32: nothing per sample
    expected = 4 * B * 400 * (2 * HQ * D + 2 * HKV * D + HQ)
    assert _saved_bytes(2) == _saved_bytes(100) == expected


def test_working_memory_per_call_is_bounded_whatever_s(monkeypatch):
    """Every dense call's (B*Hc, G, C, K) logits stay within the call budget, at s = 8 and s = 200
    (a budget that still fits one 16-query chunk of a band as long as the sequence)."""
    sizes = []
    real = plsh_onepass.dense_fwd

    def spy(q, k, v, **kw):
        sizes.append(q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2])
        return real(q, k, v, **kw)

    monkeypatch.setattr(plsh_onepass, "dense_fwd", spy)
    monkeypatch.setattr(plsh_onepass, "CALL_BUDGET", 1 << 17)
    q, k, v, _ = _qkv(3000, dtype=torch.float32, seed=1)
    for s in (8, 200):
        sizes.clear()
        with torch.no_grad():
            plsh_attention(q, k, v, sigma=_sigma(True), num_samples=s, seed=0, method="onepass")
        assert sizes and max(sizes) <= 1 << 17, (s, max(sizes))


_PEAK_RSS = """
import os, resource, sys, torch
torch.set_num_threads(1)
from plsh_dist.hashing import alibi_slopes
from plsh_dist.ops import plsh_attention
q, k, v = (torch.randn(1, 8192, 8, 64, requires_grad=True) for _ in range(3))
base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
plsh_attention(q, k, v, sigma=alibi_slopes(8).reciprocal(), num_samples=int(sys.argv[1]), seed=0,
               method="onepass").sum().backward()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""


def test_peak_memory_does_not_grow_with_s():
    """Peak RSS of a fwd+bwd at T = 8192 (fresh processes): s = 100 needs no more than s = 8
    (each call's block bounds count against the same per-call budget as its logits)."""
    import subprocess
    import sys

    def peak_kib(s):
        out = subprocess.run([sys.executable, "-c", _PEAK_RSS, str(s)], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    small, large = peak_kib(8), peak_kib(100)
    assert large <= 1.15 * small, (small, large)


def test_count_bias_equals_bucket_comparison():
    """log c_ij from the scattered block starts equals counting shared buckets directly."""
    T, s = 200, 9
    lsh = PositionalLSH(torch.tensor([3.0, 40.0]), s, seed=4)
    pos = torch.arange(T) + 50
    buckets = lsh.buckets(pos)
    for causal in (True, False):
        for h in range(2):
            for call in plsh_onepass._calls(lsh, h, pos, causal, heads_batch=1):
                bias = plsh_onepass.count_bias(call, lsh, h, pos, causal, torch.float64)[:, 0]  # (G, C, K)
                b = buckets[:, h]
                same = (b[:, call.q_idx][..., None] == b[:, call.k_idx][:, :, None, :]).sum(0)  # (G, C, K)
                key = call.k0[:, None, None] + torch.arange(call.k_idx.shape[1])
                same = same.masked_fill(key >= T, 0)  # clamped padding keys
                if causal:
                    same = same.masked_fill(key > call.q_idx[..., None], 0)
                torch.testing.assert_close(bias, torch.log(same.double()), atol=1e-14, rtol=0)


def test_method_is_validated_and_auto_rule():
    q, k, v, _ = _qkv(16)
    with pytest.raises(ValueError, match="method must be one of"):
        plsh_attention(q, k, v, sigma=2.0, num_samples=2, seed=0, method="fast")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # choosing a strategy touches no device
    padded = lambda method, s: choose_strategy("torch", method, cpu, torch.float32, s).onepass
    varlen = lambda method, s: choose_strategy("torch", method, cuda, torch.bfloat16, s).onepass
    assert padded("auto", 8) and not padded("auto", 1)
    assert not varlen("auto", 8) and varlen("onepass", 8)
    assert not padded("per_sample", 8)
