"""The GPU benchmark's CPU-checkable logic: its method grid, its FLOP counts (useful and
visited) and its target verdicts, and one toy run of the kernel's rows under Triton's
interpreter. The timings themselves need a GPU (``make gpu-check``)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: E402
from plsh_dist.ops.flex.attend import flex_status  # noqa: E402
from plsh_dist.ops.reference import alibi_weights, dense_attention  # noqa: E402
from plsh_dist.plan.kernel_tiles import floor_tiles, kernel_tiles  # noqa: E402
from tests.launchers import load_launcher  # noqa: E402


def _bench():
    return load_launcher("bench_attention_gpu")


def test_flops_useful_and_visited():
    bench = _bench()
    args = SimpleNamespace(heads=4, head_dim=64, window=64)
    T = 1024
    useful, visited = bench.flops_for("plsh_triton_perhead_s8", {"backend": "triton", "sigma": "per_head", "s": 8},
                                      T, args)
    k = kernel_tiles(PositionalLSH(alibi_slopes(4).double().reciprocal(), 8, seed=0), T, 4, head_dim=64)
    assert visited == 64 * (4 * k.forward_area + 7 * k.backward_area)
    assert 0 < useful < visited  # whole tiles cover the band and more
    useful, visited = bench.flops_for("sdpa_flash_causal", {"exact": True}, T, args)
    assert useful == 3.5 * 4 * 64 * 4 * T * (T + 1) / 2
    assert visited == 3.5 * 4 * 64 * floor_tiles(T, 4) * 128**2 >= useful
    useful, visited = bench.flops_for("alibi_window_triton", {"window": 64, "windows": [64]}, T, args)
    assert useful == bench.window_flops(T, 4, 64, 64) and visited > useful


def test_targets_say_not_measured_without_a_gpu_and_judge_gpu_records():
    bench = _bench()
    cpu = [{"method": m, "T": 8192, "status": "ok", "time_s": 1.0, "tflops_visited": 1.0, "device_type": "cpu"}
           for m in ("sdpa_flash_causal", bench.KERNEL)]
    assert all(v == "not measured on a GPU" for _, v in bench.targets(cpu))
    gpu = [{"method": "sdpa_flash_causal", "T": 8192, "status": "ok", "time_s": 4.0, "tflops_visited": 400.0,
            "device_type": "cuda"},
           {"method": bench.KERNEL, "T": 8192, "status": "ok", "time_s": 1.0, "tflops_visited": 150.0,
            "device_type": "cuda"}]
    verdicts = dict(bench.targets(gpu))
    assert verdicts[f"T=8192: {bench.KERNEL} >= 3x faster than the causal flash floor"] == "4.00x: met"
    assert verdicts["T=8192: its TFLOP/s over visited tiles >= half the floor's"].endswith("NOT met")


def test_toy_run_covers_every_method(tmp_path):
    from plsh_dist.ops.triton.attention import interpreting

    if not interpreting():
        pytest.skip("the kernel's rows run on CPU under Triton's interpreter only")
    bench = _bench()
    assert bench.main(["--out", str(tmp_path), "--lengths", "64", "--heads", "2", "--head-dim", "16", "--samples",
                       "8", "--window", "16", "--repeats", "1", "--warmup", "0", "--no-flex", "--cpu"]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    by_method = {r["method"]: r for r in result["records"]}
    for name in ("sdpa_flash_causal", "plsh_triton_perhead_s8", "plsh_triton_sigma256_s8", "alibi_window_triton",
                 "alibi_window_triton_perhead", "alibi_chunked", "alibi_window_chunked", "alibi_window_perhead_chunked",
                 "plsh_torch_perhead_s8"):
        assert by_method[name]["status"] == "ok", (name, by_method[name])
        assert math.isfinite(by_method[name]["tflops"]) and math.isfinite(by_method[name]["tflops_visited"])
    assert "not measured on a GPU" in (tmp_path / "results.md").read_text()


def _flex_builder(kind: str, T: int, H: int):
    """(the benchmark's FlexAttention fn, the fp64 weights of the same bias) at length T."""
    bench = _bench()
    slopes = alibi_slopes(H)
    if kind == "plsh_hash":  # the count from the pitch and shift tables
        sigma = slopes.double().reciprocal() * 3
        return bench.flex_plsh(sigma, 8, T, "cpu"), PositionalLSH(sigma, 8, seed=0).averaged_mask(torch.arange(T))
    window = None if kind == "alibi" else torch.tensor([1, 5, 40, 500])[:H]
    return bench.flex_alibi(slopes, T, window, "cpu"), alibi_weights(slopes, torch.arange(T), window)


@pytest.mark.skipif(flex_status("cpu") is not None, reason="no CPU FlexAttention here")
@pytest.mark.parametrize("kind", ["plsh_hash", pytest.param("alibi", marks=pytest.mark.slow),
                                  pytest.param("alibi_window_perhead", marks=pytest.mark.slow)])
def test_flex_builders_match_the_fp64_reference_on_cpu(kind):
    """The GPU benchmark's FlexAttention rows, forward only on CPU (its compiled FlexAttention has no
    backward there): 300 tokens, so full, partial and skipped key blocks all occur."""
    T, H = 300, 4
    fn, weights = _flex_builder(kind, T, H)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, H, 32, generator=g) for _ in range(3))
    with torch.no_grad():
        out = fn(q, k, v)
    torch.testing.assert_close(out.double(), dense_attention(q, k, v, weights, causal=True), atol=2e-5, rtol=2e-5)
