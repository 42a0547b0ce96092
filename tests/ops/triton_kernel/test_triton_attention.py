"""The Triton kernel against the dense fp64 reference: out, lse, dq, dk, dv.

Under Triton's CPU interpreter (``tests/conftest.py``), fp32 inputs (and one fp16
case; the interpreter's bf16 dot is wrong), or compiled on a GPU where there is one
(then also bf16). Sizes are small: the interpreter runs every program one after
another in numpy.
"""

import pytest
import torch

pytest.importorskip("triton")

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes  # noqa: E402
from plsh_dist.ops.documents import Documents  # noqa: E402
from plsh_dist.ops.triton.attention import (alibi_window_attention, triton_onepass_backward,  # noqa: E402
                                          triton_onepass_forward)

from kernel_cases import brute_counts, dense_reference, kernel_device, random_qkv, window_weights  # noqa: E402

FP32 = dict(atol=2e-5, rtol=2e-5)
FP32_GRAD = dict(atol=1e-4, rtol=1e-4)  # four fp32 products per gradient entry
HALF = {torch.float16: dict(atol=2e-2, rtol=2e-2), torch.bfloat16: dict(atol=1e-1, rtol=5e-2)}  # bf16: GPU only
PER_HEAD = torch.tensor([0.8, 5.0, 60.0, 700.0], dtype=torch.float64)  # 1-token blocks up to bands of many tiles


def _check(q, k, v, dout, lsh, positions, causal, docs=None, tol=FP32, grad_tol=FP32_GRAD):
    scale = q.shape[-1] ** -0.5
    dev = kernel_device()
    qd, kd, vd, dod = (x.to(dev) for x in (q, k, v, dout))
    out, lse = triton_onepass_forward(qd, kd, vd, lsh, positions, causal=causal, scale=scale, docs=docs)
    dq, dk, dv = triton_onepass_backward(dod, qd, kd, vd, out, lse, lsh, positions, causal=causal, scale=scale,
                                         docs=docs)
    out, lse, dq, dk, dv = (x.cpu() for x in (out, lse, dq, dk, dv))
    counts = brute_counts(lsh, positions, causal, docs)
    ref = dense_reference(q, k, v, counts, scale, dout)
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), ref):
        assert torch.isfinite(got).all(), name
        assert got.dtype == (torch.float32 if name == "lse" else q.dtype), name
        torch.testing.assert_close(got.double(), want, **(tol if name in ("out", "lse") else grad_tol), msg=name)


CASES = {
    # name: (B, n, Hq, Hkv, D, sigma, s, causal, first position)
    "per_head-causal-gqa-offset": (2, 100, 4, 2, 64, PER_HEAD, 8, True, 1000),
    "per_head-full-gqa": (1, 90, 4, 2, 64, PER_HEAD, 8, False, 0),
    "shared-causal-gqa4-s3": (1, 130, 4, 1, 64, 16.0, 3, True, 7),
    "per_head-full-s1": (1, 100, 2, 2, 64, PER_HEAD[:2] * 3, 1, False, 0),
    "shared-causal-s100": (1, 50, 1, 1, 64, 4.0, 100, True, 0),
    # beyond 16 samples near tiles count as a product over the runs of blocks (sigma 0.8: many per tile)
    "per_head-causal-gqa-s100-offset": (1, 150, 4, 2, 64, PER_HEAD, 100, True, 5000),
    "per_head-full-gqa-s100": (1, 110, 4, 2, 64, PER_HEAD, 100, False, 0),
    "per_head-causal-s40-d128": (1, 130, 2, 1, 128, PER_HEAD[:2], 40, True, 17),
    "shared-causal-d128": (1, 100, 2, 1, 128, 30.0, 8, True, 0),
    "per_head-full-d24": (1, 70, 2, 1, 24, PER_HEAD[1:3], 4, False, 3),  # head dim padded to 32 inside
}


@pytest.mark.parametrize("case", list(CASES))
def test_plsh_matches_dense_reference(case):
    B, n, Hq, Hkv, D, sigma, s, causal, first = CASES[case]
    q, k, v, dout = random_qkv(B, n, Hq, Hkv, D, seed=len(case))
    lsh = PositionalLSH(sigma, s, seed=42, sampler="stratified_ramp")
    _check(q, k, v, dout, lsh, first + torch.arange(n), causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fixed_blocks_through_the_same_kernel(causal):
    q, k, v, dout = random_qkv(1, 140, 4, 2, 64, seed=3)
    _check(q, k, v, dout, FixedBlocks(alibi_slopes(4).double().reciprocal() * 4), torch.arange(140), causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_documents_at_large_s(causal):
    q, k, v, dout = random_qkv(1, 100, 2, 1, 64, seed=6)
    cu = torch.tensor([0, 1, 33, 34, 70, 100])  # 1-token documents, a document start inside a tile
    lengths = cu[1:] - cu[:-1]
    docs = Documents.from_cu_seqlens(cu, torch.cat([torch.arange(int(n)) for n in lengths]))
    lsh = PositionalLSH(PER_HEAD[:2], 64, seed=8)
    _check(q, k, v, dout, lsh, docs.positions, causal, docs=docs)


def test_documents_with_one_token_documents():
    """cu_seqlens documents (blocks cut at document starts), positions restarting per document."""
    cu = torch.tensor([0, 1, 2, 50, 51, 90])
    lengths = cu[1:] - cu[:-1]
    docs = Documents.from_cu_seqlens(cu, torch.cat([torch.arange(int(L)) for L in lengths]))
    q, k, v, dout = random_qkv(1, 90, 4, 2, 64, seed=5)
    lsh = PositionalLSH(PER_HEAD, 8, seed=1)
    for causal in (True, False):
        _check(q, k, v, dout, lsh, docs.positions, causal, docs=docs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_inputs_accumulate_in_fp32(dtype):
    if dtype == torch.bfloat16 and kernel_device().type == "cpu":
        pytest.skip("Triton's interpreter computes bf16 dots wrongly (a GPU runs this case)")
    q, k, v, dout = random_qkv(1, 100, 4, 2, 64, dtype=dtype, seed=9)
    _check(q, k, v, dout, PositionalLSH(PER_HEAD, 8, seed=2), torch.arange(100), True, tol=HALF[dtype],
           grad_tol=HALF[dtype])


def test_zero_query_rows_add_nothing():
    """The SP halo rows: q = dout = out = lse = 0 rows give finite, zero contributions."""
    dev = kernel_device()
    q, k, v, dout = random_qkv(1, 96, 2, 2, 64, seed=4)
    lsh = PositionalLSH(torch.tensor([3.0, 50.0]), 8, seed=0)
    pos, scale = torch.arange(96), 64**-0.5
    out, lse = (x.cpu() for x in triton_onepass_forward(q.to(dev), k.to(dev), v.to(dev), lsh, pos, causal=True,
                                                        scale=scale))
    halo = 20
    q0, d0, o0, l0 = q.clone(), dout.clone(), out.clone(), lse.clone()
    q0[:, :halo], d0[:, :halo], o0[:, :halo], l0[:, :, :halo] = 0, 0, 0, 0
    dq, dk, dv = (x.cpu() for x in triton_onepass_backward(*(x.to(dev) for x in (d0, q0, k, v, o0, l0)), lsh, pos,
                                                           causal=True, scale=scale))
    ref = dense_reference(q0, k, v, brute_counts(lsh, pos, True), scale, d0)
    for got, want in zip((dk, dv), ref[3:]):
        torch.testing.assert_close(got.double(), want, **FP32_GRAD)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_windowed_alibi_bias(causal):
    """Exact ALiBi inside a per-head window, each head banded by its own window, with documents."""
    sigma = torch.tensor([1.0, 8.0, 60.0, 900.0])
    window = torch.tensor([1, 7, 70, 1000])
    cu = torch.tensor([0, 1, 90, 140])
    docs = Documents.from_cu_seqlens(cu, torch.cat([torch.arange(1), torch.arange(89), torch.arange(50)]))
    q, k, v, dout = (x.to(kernel_device()) for x in random_qkv(1, 140, 4, 2, 64, seed=6))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out, lse = alibi_window_attention(q, k, v, sigma=sigma, window=window, positions=docs.positions, causal=causal,
                                      docs=docs)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    q, k, v, dout, out, lse, dq, dk, dv = (x.detach().cpu() for x in (q, k, v, dout, out, lse, dq, dk, dv))
    ref = dense_reference(q, k, v, window_weights(sigma, window, docs.positions, causal, docs), 64**-0.5, dout)
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), ref):
        torch.testing.assert_close(got.detach().double(), want, **(FP32 if name in ("out", "lse") else FP32_GRAD),
                                   msg=name)


def test_public_op_with_documents_matches_the_onepass_path():
    """plsh_attention(backend="triton") with cu_seqlens over two batch rows (the flat-row documents
    path, autograd included) equals the device-generic one-pass path."""
    from plsh_dist.ops import plsh_attention

    dev = kernel_device()
    q, k, v, dout = random_qkv(2, 64, 2, 1, 32, seed=8)
    cu = torch.tensor([0, 1, 40, 64, 100, 128], dtype=torch.int32)
    kw = dict(sigma=torch.tensor([2.0, 30.0]), num_samples=4, seed=5, cu_seqlens=cu, return_lse=True)
    results = []
    for backend, x in (("triton", dev), ("torch", torch.device("cpu"))):
        leaves = [t.to(x).requires_grad_() for t in (q, k, v)]
        out, lse = plsh_attention(*leaves, backend=backend, method="onepass", **kw)
        grads = torch.autograd.grad(out, leaves, dout.to(x))
        results.append([t.detach().cpu() for t in (out, lse, *grads)])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, **FP32_GRAD)


@pytest.mark.parametrize("window", ["truncated", "one", "exact", "one_documents"])
def test_alibi_attention_runs_on_the_kernel(window, monkeypatch):
    """``alibi_attention`` sends exact, windowed and truncated ALiBi to the kernel where the kernel
    runs (CUDA; on CPU the interpreter stands in for the device check) and equals the chunked path,
    gradients and lse included, with GQA and batch 2 (and packed documents)."""
    import plsh_dist.ops.alibi_kernel as alibi_kernel
    from plsh_dist.ops import triton as triton_onepass  # the wing alibi calls through
    from plsh_dist.ops.alibi import alibi_attention, equal_cost_c, truncation_windows

    dev = kernel_device()
    if dev.type == "cpu":
        monkeypatch.setattr(alibi_kernel, "triton_cuda", lambda device, dtype: True)  # where ALiBi chooses
    calls = []
    real = triton_onepass.banded_forward
    monkeypatch.setattr(triton_onepass, "banded_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    slopes = alibi_slopes(4)
    w = {"truncated": truncation_windows(equal_cost_c(8), slopes.reciprocal()), "exact": None}.get(window, 24)
    q, k, v, dout = random_qkv(2, 96, 4, 2, 32, seed=3)
    cu = torch.tensor([0, 1, 40, 96, 150, 192]) if window == "one_documents" else None
    results = []
    for x, chunk in ((dev, None), (torch.device("cpu"), 16)):  # chunk_size keeps the chunked path
        leaves = [t.to(x).requires_grad_() for t in (q, k, v)]
        out, lse = alibi_attention(*leaves, slopes=slopes, window=w, chunk_size=chunk, return_lse=True,
                                   cu_seqlens=cu)
        results.append([t.detach().cpu() for t in (out, lse, *torch.autograd.grad(out, leaves, dout.to(x)))])
    assert calls == [1]
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), *results):
        torch.testing.assert_close(got, want, **(FP32 if name in ("out", "lse") else FP32_GRAD), msg=name)
