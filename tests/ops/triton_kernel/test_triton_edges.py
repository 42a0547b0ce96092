"""The fused kernel's edge cases against the fp64 reference: huge sigma, positions near 2^31,
rows that see no key, and bf16 rounding exercised on the CPU interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from plsh_dist.hashing import PositionalLSH  # noqa: E402
from plsh_dist.ops.triton.tile_bands import CountBias  # noqa: E402
from plsh_dist.ops.triton.token_layout import TokenLayout  # noqa: E402
from plsh_dist.ops.triton.attention import banded_backward, banded_forward  # noqa: E402

from kernel_cases import brute_counts, dense_reference, kernel_device, random_qkv  # noqa: E402

FP32 = dict(atol=2e-5, rtol=2e-5)
FP32_GRAD = dict(atol=1e-4, rtol=1e-4)
BF16 = dict(atol=2e-2, rtol=2e-2)  # p and dS rounded to bf16 (8 bits) before their products


def _run(q, k, v, dout, lsh, positions, causal, *, emulate_bf16=False, lse_edit=None):
    dev = kernel_device()
    bias, layout = CountBias.of(lsh, dev), TokenLayout.build(positions, dev)
    scale = q.shape[-1] ** -0.5
    qd, kd, vd, dod = (x.to(dev) for x in (q, k, v, dout))
    out, lse = banded_forward(qd, kd, vd, bias, layout, causal=causal, scale=scale, emulate_bf16=emulate_bf16)
    if lse_edit is not None:
        out, lse = lse_edit(out, lse)
    grads = banded_backward(dod, qd, kd, vd, out, lse, bias, layout, causal=causal, scale=scale,
                            emulate_bf16=emulate_bf16)
    return [x.cpu() for x in (out, lse, *grads)]


def _assert_reference(got, q, k, v, dout, lsh, positions, causal, tol=FP32, grad_tol=FP32_GRAD):
    ref = dense_reference(q, k, v, brute_counts(lsh, positions, causal), q.shape[-1] ** -0.5, dout)
    for name, g, want in zip(("out", "lse", "dq", "dk", "dv"), got, ref):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double(), want, **(tol if name in ("out", "lse") else grad_tol), msg=name)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_huge_sigma_is_one_block(causal):
    """sigma = 1e12: every sample's block holds every position (c = s), finite and exact."""
    q, k, v, dout = random_qkv(1, 70, 2, 1, 32, seed=1)
    lsh = PositionalLSH(torch.tensor([1e12, 1e6], dtype=torch.float64), 4, seed=0)
    positions = torch.arange(70)
    assert int(brute_counts(lsh, positions, causal).max()) == 4
    _assert_reference(_run(q, k, v, dout, lsh, positions, causal), q, k, v, dout, lsh, positions, causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_positions_near_int32_max(causal):
    n = 80
    positions = 2**31 - n + torch.arange(n)  # the last one is 2^31 - 1
    q, k, v, dout = random_qkv(1, n, 2, 2, 32, seed=2)
    lsh = PositionalLSH(torch.tensor([3.0, 40.0], dtype=torch.float64), 6, seed=5)
    _assert_reference(_run(q, k, v, dout, lsh, positions, causal), q, k, v, dout, lsh, positions, causal)


def test_rows_that_saw_no_key_get_zero_gradients():
    """A row whose forward saw no key (out = 0, lse = -inf) adds nothing and gets dq = 0, not NaN."""
    n, dead = 96, torch.tensor([0, 5, 40, 95])
    q, k, v, dout = random_qkv(1, n, 2, 2, 32, seed=3)
    lsh = PositionalLSH(torch.tensor([2.0, 30.0], dtype=torch.float64), 8, seed=1)

    def kill(out, lse):
        out, lse = out.clone(), lse.clone()
        out[:, dead], lse[:, :, dead] = 0.0, float("-inf")
        return out, lse

    out, lse, dq, dk, dv = _run(q, k, v, dout, lsh, torch.arange(n), True, lse_edit=kill)
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert torch.equal(dq[:, dead], torch.zeros_like(dq[:, dead]))
    # dk, dv: the other rows' contributions only (the dead rows' dout removed)
    d0 = dout.clone()
    d0[:, dead] = 0.0
    ref = dense_reference(q, k, v, brute_counts(lsh, torch.arange(n), True), 32**-0.5, d0)
    torch.testing.assert_close(dk.double(), ref[3], **FP32_GRAD)
    torch.testing.assert_close(dv.double(), ref[4], **FP32_GRAD)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def test_bf16_rounding_on_fp32_inputs():
    """bf16 without a GPU: bf16 values held in fp32, p and dS rounded to bf16 before their products
    exactly where the compiled bf16 kernel casts them; against the fp64 reference at bf16 tolerances,
    and the rounding really happens (the result differs from the unrounded fp32 run)."""
    q, k, v, dout = (_bf16(x) for x in random_qkv(1, 100, 4, 2, 64, seed=9))
    lsh = PositionalLSH(torch.tensor([0.8, 5.0, 60.0, 700.0], dtype=torch.float64), 8, seed=2)
    positions = torch.arange(100)
    got = _run(q, k, v, dout, lsh, positions, True, emulate_bf16=True)
    _assert_reference(got, q, k, v, dout, lsh, positions, True, tol=BF16, grad_tol=BF16)
    exact = _run(q, k, v, dout, lsh, positions, True)
    assert not torch.equal(got[0], exact[0]) and not torch.equal(got[3], exact[3])
    torch.testing.assert_close(got[0], exact[0], atol=1e-2, rtol=1e-2)
