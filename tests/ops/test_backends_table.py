"""The one table (plsh_dist.ops.backends.choose_strategy): every (backend, method, device, dtype, s)
gets the strategy the README promises, or an error naming what it needs. Choosing touches no device."""

import pytest
import torch

from plsh_dist.ops import backends
from plsh_dist.ops.triton import attention as triton_onepass
from plsh_dist.ops.varlen import kernels as varlen_kernels
from plsh_dist.ops.backends import TABLE, Backend, Method, choose_strategy
from plsh_dist.ops.decode import DecodeOnePass
from plsh_dist.ops.dense import DenseKernel
from plsh_dist.ops.cpu.onepass import OnePass
from plsh_dist.ops.cpu.padded import PaddedPerSample
from plsh_dist.ops.varlen.strategy import VarlenPerSample
from plsh_dist.ops.triton.attention import TritonOnePass
from plsh_dist.ops.varlen.kernels import VarlenKernel

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
BF16, FP32 = torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def triton_missing(monkeypatch):
    """By default the rows as on a machine without Triton (the tests below that want it say so)."""
    monkeypatch.setattr(triton_onepass, "triton_status", lambda: "triton is not importable (test)")


@pytest.fixture
def triton_installed(monkeypatch):
    monkeypatch.setattr(triton_onepass, "triton_status", lambda: None)
    monkeypatch.setattr(triton_onepass, "interpreting", lambda: True)


@pytest.fixture
def flash_attn_installed(monkeypatch):
    monkeypatch.setattr(varlen_kernels, "flash_attn_module", lambda: object())


@pytest.mark.parametrize("backend,method,device,dtype,s,expected", [
    ("auto", "auto", CPU, FP32, 8, OnePass(DenseKernel.AUTO)),
    ("auto", "auto", CPU, FP32, 1, PaddedPerSample(DenseKernel.AUTO)),
    ("auto", "per_sample", CPU, BF16, 8, PaddedPerSample(DenseKernel.AUTO)),
    ("torch", "onepass", CPU, FP32, 1, OnePass(DenseKernel.AUTO)),
    ("math", "auto", CPU, FP32, 8, OnePass(DenseKernel.MATH)),
    ("math", "auto", CUDA, BF16, 1, PaddedPerSample(DenseKernel.MATH)),
    ("math", "per_sample", CUDA, BF16, 8, PaddedPerSample(DenseKernel.MATH)),
    ("auto", "auto", CUDA, BF16, 8, VarlenPerSample(VarlenKernel.ATEN)),  # flash-attn not installed
    ("torch", "onepass", CUDA, BF16, 8, OnePass(DenseKernel.AUTO)),
    ("auto", "auto", CUDA, FP32, 8, OnePass(DenseKernel.AUTO)),  # varlen kernels take fp16/bf16 only
])
def test_choose_strategy(backend, method, device, dtype, s, expected):
    assert choose_strategy(backend, method, device, dtype, s) == expected


def test_flash_attn_rows(flash_attn_installed):
    assert choose_strategy("auto", "auto", CUDA, BF16, 8) == VarlenPerSample(VarlenKernel.FLASH_ATTN)
    assert choose_strategy("flash_attn", "per_sample", CUDA, BF16, 1) == VarlenPerSample(VarlenKernel.FLASH_ATTN)
    assert choose_strategy("flash_attn", "onepass", CUDA, BF16, 8) == OnePass(DenseKernel.AUTO)
    assert choose_strategy("torch", "auto", CUDA, BF16, 8) == VarlenPerSample(VarlenKernel.ATEN)
    assert choose_strategy("auto", "auto", CPU, FP32, 8) == OnePass(DenseKernel.AUTO)


def test_triton_rows(triton_installed, flash_attn_installed):
    """On CUDA the fused kernel comes first (also before flash-attn) for every s; on CPU only an
    explicit backend="triton" runs it (under the interpreter)."""
    for s in (1, 8, 100):
        assert choose_strategy("auto", "auto", CUDA, BF16, s) == TritonOnePass()
    assert choose_strategy("auto", "auto", CUDA, FP32, 8) == TritonOnePass()
    assert choose_strategy("triton", "onepass", CPU, FP32, 8) == TritonOnePass()
    assert choose_strategy("auto", "auto", CPU, FP32, 8) == OnePass(DenseKernel.AUTO)
    assert choose_strategy("auto", "per_sample", CUDA, BF16, 8) == VarlenPerSample(VarlenKernel.FLASH_ATTN)
    with pytest.raises(ValueError, match="has no method='per_sample'"):
        choose_strategy("triton", "per_sample", CUDA, BF16, 8)


def test_without_triton_the_current_path_runs_and_the_log_says_why(caplog):
    triton_onepass._say_once.cache_clear()
    with caplog.at_level("WARNING"):
        assert choose_strategy("auto", "auto", CUDA, BF16, 8) == VarlenPerSample(VarlenKernel.ATEN)
        assert choose_strategy("auto", "auto", CUDA, BF16, 8) == VarlenPerSample(VarlenKernel.ATEN)
    lines = [r.getMessage() for r in caplog.records if "Triton kernel" in r.getMessage()]
    assert len(lines) == 1 and "triton is not importable" in lines[0] and "\n" not in lines[0]
    with pytest.raises(ValueError, match="backend='triton' needs the triton package"):
        choose_strategy("triton", "auto", CUDA, BF16, 8)


def test_explicit_backend_that_does_not_apply_says_what_it_needs():
    with pytest.raises(ValueError, match=r"backend='flash_attn' needs CUDA tensors in fp16/bf16 and the flash-attn"):
        choose_strategy("flash_attn", "auto", CPU, FP32, 4)


@pytest.mark.parametrize("kw,field", [(dict(backend="cuda"), "backend"), (dict(method="fast"), "method")])
def test_vocabulary_errors_name_the_argument(kw, field):
    args = dict(backend="auto", method="auto") | kw
    with pytest.raises(ValueError, match=f"{field} must be one of"):
        choose_strategy(args["backend"], args["method"], CPU, FP32, 4)
    with pytest.raises(ValueError, match=f"{field} must be one of"):  # decoding checks the same vocabulary
        choose_strategy(args["backend"], args["method"], CPU, FP32, 4, decoding=True)


@pytest.mark.parametrize("backend", backends.BACKENDS)
@pytest.mark.parametrize("method", backends.METHODS)
def test_decoding_has_one_forward_only_path(backend, method):
    strategy = choose_strategy(backend, method, CPU, FP32, 8, decoding=True)
    assert isinstance(strategy, DecodeOnePass) and not hasattr(strategy, "backward")


def test_every_row_is_reachable_and_says_what_it_computes():
    """Each row is the answer for its own backend, method and a device where it applies; a strategy's
    ``onepass`` agrees with the method column."""
    cases = {VarlenKernel.FLASH_ATTN: (CUDA, BF16), VarlenKernel.ATEN: (CUDA, BF16)}
    for row in TABLE:
        assert row.strategy.onepass == (row.method is Method.ONEPASS)
        assert isinstance(row.backend, Backend)
        device, dtype = cases.get(getattr(row.strategy, "kernel", None), (CPU, FP32))
        if row.applies(device, dtype):
            first = next(r for r in TABLE if r.backend is row.backend and r.method is row.method
                         and r.applies(device, dtype))
            assert choose_strategy(row.backend, row.method, device, dtype, 8, out_only=row.out_only) == first.strategy


def test_the_varlen_lse_layout_travels_in_the_plan():
    """No module state: what the forward saved carries the kernel's LSE layout to the backward, and the
    padded layout the older kernels use round-trips exactly."""
    from plsh_dist.hashing import PositionalLSH
    from plsh_dist.ops.backends import VARLEN_REFERENCE
    from plsh_dist.ops.varlen.kernels import _repad_lse, _unpad_lse

    q, k, v = (torch.randn(1, 40, 2, 8, dtype=torch.float64) for _ in range(3))
    lsh = PositionalLSH(5.0, 2, seed=0)
    out, lse, saved = VARLEN_REFERENCE.forward(q, k, v, lsh, torch.arange(40), causal=True, scale=0.3)
    assert saved.lse_padded is False and len(saved.samples) == 2
    with pytest.raises(ValueError, match="what its forward saved"):
        VARLEN_REFERENCE.backward(out, q, k, v, out, lse, lsh, torch.arange(40), causal=True, scale=0.3)
    cu = torch.tensor([0, 3, 10, 11, 25], dtype=torch.int32)
    lse_HR = torch.randn(2, 25)
    assert torch.equal(_unpad_lse(_repad_lse(lse_HR, cu, 14), cu, 25), lse_HR)
