"""GPU smoke check: is the fused kernel right in bf16, and how fast is it against the floor?

    python3 tools/gpu_smoke.py --out gpu_results      # also the first stage of gpu_check.py

Minutes, not more, on one GPU (it is sized to finish well under 4 minutes on
an H200, compiles included; not measured on a GPU), and needs nothing but
torch, Triton and this source tree (no pytest, no flash-attn, no downloads):

1. **correctness**: the three kernels of the fused one pass (forward: out and
   lse; dK/dV; dQ) in bf16 against the dense fp64 reference of the same
   counts, at two shapes (:data:`CASES`), judged by flash-attention's rule:
   each output errs at most 2x what the same formula computed by PyTorch in
   bf16 errs;
2. **timing**: forward + backward of the kernel (per-head sigma, s = 8,
   H = 16, D = 128, bf16) at 8k and 32k tokens against the causal SDPA floor
   without bias, on the flash backend and on cuDNN's when this torch has it.

Without CUDA it runs the correctness check at toy sizes in fp32 under
Triton's CPU interpreter (its bf16 dots are wrong) when ``TRITON_INTERPRET=1``
was set before triton was imported (``gpu_check.py`` does), and says that
the GPU parts were skipped. Writes ``smoke.json`` and ``smoke.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The GPU check sets its own path: it runs as `python3 tools/gpu_smoke.py` on a
# GPU machine where the package is not installed and nothing can be installed (docs/gpu.md).
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: E402
from plsh_dist.ops.gqa import repeat_kv  # noqa: E402

#: Error factor over the same-dtype PyTorch baseline, for the output, the lse and every gradient
#: (flash-attention's rule; tests/tolerances.py's BF16_FACTOR).
FACTOR = 2.0
#: Added to the allowed error, per dtype: an output the baseline gets exactly may still err by a
#: rounding of the kernel's own (fp32: the tests' fp32 tolerance).
ATOL = {torch.bfloat16: 1e-4, torch.float32: 2e-5}

#: name: (B, T, Hq, Hkv, D, sigma ("per_head" or a float), s, causal); GPU sizes, then CPU toy sizes.
CASES = {
    "per_head-causal-d128": (1, 1024, 4, 4, 128, "per_head", 8, True),
    "shared-full-gqa-d64": (2, 777, 4, 2, 64, 64.0, 8, False),
}
TOY_CASES = {
    "per_head-causal-d64": (1, 96, 2, 2, 64, "per_head", 8, True),
    "shared-full-gqa-d32": (1, 80, 2, 1, 32, 16.0, 4, False),
}
TIMING_LENGTHS = (8192, 32768)
#: Seconds after which the smoke stage skips what is left of it (the timings), and says so: the
#: stage must leave the full stage its time.
SMOKE_BUDGET_S = 200.0
TIMING_SHAPE = dict(heads=16, head_dim=128, samples=8)


def _sigma(spec, H: int):
    return alibi_slopes(H).double().reciprocal() if spec == "per_head" else spec


def _counts(lsh: PositionalLSH, positions: torch.Tensor, causal: bool) -> torch.Tensor:
    """``c_ij = #{t : bucket_t(i) == bucket_t(j)}`` (Hh, n, n) float64 from the hash's buckets, 0 above the
    diagonal when causal."""
    b = lsh.buckets(positions)
    c = (b[:, :, :, None] == b[:, :, None, :]).sum(0).to(torch.float64)
    return c.tril() if causal else c


def _dense(q, k, v, counts, scale, dout, dtype):
    """``softmax(q k^T scale + log c) v`` computed by PyTorch in ``dtype``: out, lse, dq, dk, dv."""
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    logits = torch.einsum("bihd,bjhd->bhij", q, repeat_kv(k, g)) * scale + counts.to(q.device, dtype).log()[None]
    lse = torch.logsumexp(logits.to(torch.promote_types(dtype, torch.float32)), dim=-1)
    out = torch.einsum("bhij,bjhd->bihd", torch.softmax(logits, dim=-1), repeat_kv(v, g))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
    return out.detach(), lse.detach(), dq, dk, dv


def check_case(name: str, case: tuple, device: torch.device, dtype: torch.dtype) -> dict:
    """The kernel against fp64 and the same-dtype baseline at one shape: per output, both errors
    and the verdict."""
    from plsh_dist.ops.triton.attention import triton_onepass_backward, triton_onepass_forward  # noqa: PLC0415

    B, T, Hq, Hkv, D, sigma, s, causal = case
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, h, D, generator=g).to(device, dtype) for h in (Hq, Hkv, Hkv))
    dout = torch.randn(B, T, Hq, D, generator=g).to(device, dtype)
    lsh = PositionalLSH(_sigma(sigma, Hq), s, seed=0)
    positions = torch.arange(T)
    scale = D**-0.5
    out, lse = triton_onepass_forward(q, k, v, lsh, positions, causal=causal, scale=scale)
    grads = triton_onepass_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale)
    counts = _counts(lsh, positions, causal).to(device)
    ref = _dense(q, k, v, counts, scale, dout, torch.float64)
    base = _dense(q, k, v, counts, scale, dout, dtype)
    outputs = {}
    for (output, kernel, factor), got, want, baseline in zip(
            (("out", "forward", FACTOR), ("lse", "forward", FACTOR), ("dq", "dQ", FACTOR),
             ("dk", "dK/dV", FACTOR), ("dv", "dK/dV", FACTOR)), (out, lse, *grads), ref, base):
        err = float((got.double() - want).abs().max())
        base_err = float((baseline.double() - want).abs().max())
        ok = bool(torch.isfinite(got).all()) and err <= factor * base_err + ATOL[dtype]
        outputs[output] = {"kernel": kernel, "max_abs_error": err, "baseline_error": base_err, "factor": factor,
                           "ok": ok}
    return {"case": name, "shape": dict(zip(("B", "T", "Hq", "Hkv", "D", "sigma", "s", "causal"), case)),
            "dtype": str(dtype).split(".")[-1], "device": device.type, "outputs": outputs,
            "ok": all(o["ok"] for o in outputs.values())}


def _bench_module():
    """benchmarks/bench_attention_gpu.py (its timer and SDPA floor), loaded from its file."""
    spec = importlib.util.spec_from_file_location("bench_attention_gpu", ROOT / "benchmarks" / "bench_attention_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timings(device: torch.device, lengths=TIMING_LENGTHS, shape=None, repeats: int = 3) -> list[dict]:
    """Forward + backward milliseconds of the kernel and the floors at ``lengths``, bf16 on CUDA
    (fp32 on CPU: the interpreter's bf16 dots are wrong; tests of this code only)."""
    from plsh_dist.ops import plsh_attention  # noqa: PLC0415

    bench = _bench_module()
    shape = shape or TIMING_SHAPE
    H, D, s = shape["heads"], shape["head_dim"], shape["samples"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sigma = alibi_slopes(H).double().reciprocal()
    methods = {"plsh_triton_perhead_s8": lambda q, k, v: plsh_attention(q, k, v, sigma=sigma, num_samples=s, seed=0,
                                                                        backend="triton"),
               "sdpa_flash_causal": bench.sdpa_causal("flash")}
    if bench.cudnn_sdpa_available():
        methods["sdpa_cudnn_causal"] = bench.sdpa_causal("cudnn")
    records = []
    for T in lengths:
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, T, H, D, generator=g, device=device, dtype=dtype).requires_grad_()
                   for _ in range(3))
        for name, fn in methods.items():
            try:
                times = bench.time_fwd_bwd(fn, q, k, v, repeats, 1, device)
                records.append({"T": T, "method": name, "status": "ok", "time_ms": statistics.median(times) * 1e3,
                                "times_ms": [t * 1e3 for t in times]})
            except Exception as exc:  # one failing method must not hide the others' times
                records.append({"T": T, "method": name, "status": f"error: {type(exc).__name__}: {exc}"[:300]})
            print(f"smoke timing T={T} {name}: {records[-1].get('time_ms', records[-1]['status'])}", flush=True)
        del q, k, v
    for r in records:
        floors = [f["time_ms"] for f in records if f["T"] == r["T"] and f["method"].startswith("sdpa")
                  and f["status"] == "ok"]
        if r["status"] == "ok" and floors:
            r["speedup_vs_fastest_floor"] = min(floors) / r["time_ms"]
    return records


def run_smoke(out: Path) -> dict:
    """Both parts (the GPU ones only with CUDA); writes ``smoke.json`` and ``smoke.md``; the result."""
    from plsh_dist.ops.triton.attention import interpreting, triton_status  # noqa: PLC0415

    t0 = time.time()
    cuda = torch.cuda.is_available()
    result = {"cuda": cuda, "device": torch.cuda.get_device_name() if cuda else "CPU", "torch": torch.__version__,
              "correctness": [], "timings": [], "skipped": []}
    why = triton_status()
    if why is not None:
        result["skipped"].append(f"kernel correctness and timing: {why}")
    elif cuda:
        device = torch.device("cuda")
        result["correctness"] = [check_case(n, c, device, torch.bfloat16) for n, c in CASES.items()]
        if time.time() - t0 > SMOKE_BUDGET_S:
            result["skipped"].append(f"timings: the correctness check took {time.time() - t0:.0f} s, over the "
                                     f"smoke stage's {SMOKE_BUDGET_S:.0f} s")
        else:
            result["timings"] = timings(device)
    else:
        result["skipped"].append("bf16 correctness and every timing: no CUDA (nothing here is measured on a GPU)")
        if interpreting():
            result["correctness"] = [check_case(n, c, torch.device("cpu"), torch.float32)
                                     for n, c in TOY_CASES.items()]
        else:
            result["skipped"].append("the interpreter check: TRITON_INTERPRET=1 was not set before triton was imported")
    result["ok"] = all(c["ok"] for c in result["correctness"])
    result["wall_s"] = round(time.time() - t0, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "smoke.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "smoke.md").write_text(markdown(result))
    return result


def markdown(result: dict) -> str:
    lines = [f"# GPU smoke check on {result['device']} (torch {result['torch']}), {result['wall_s']} s", ""]
    lines += [f"- SKIPPED: {s}" for s in result["skipped"]]
    if result["correctness"]:
        lines += ["", "Kernel against the fp64 reference (max abs error; allowed: factor x the same-dtype "
                      "PyTorch baseline's error):", "",
                  "| case | dtype | output | kernel | error | baseline error | factor | ok |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in result["correctness"]:
            for name, o in c["outputs"].items():
                lines.append(f"| {c['case']} | {c['dtype']} | {name} | {o['kernel']} | {o['max_abs_error']:.3g} | "
                             f"{o['baseline_error']:.3g} | {o['factor']:g} | {'yes' if o['ok'] else '**NO**'} |")
    if result["timings"]:
        lines += ["", "Forward + backward, bf16, batch 1, H = 16, D = 128 (median ms):", "",
                  "| T | method | ms | speedup vs the fastest floor |", "|---|---|---|---|"]
        for r in result["timings"]:
            ms = f"{r['time_ms']:.3f}" if r["status"] == "ok" else r["status"]
            speed = f"{r['speedup_vs_fastest_floor']:.2f}x" if "speedup_vs_fastest_floor" in r else ""
            lines.append(f"| {r['T']} | {r['method']} | {ms} | {speed} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for smoke.json and smoke.md")
    result = run_smoke(Path(p.parse_args(argv).out))
    print(markdown(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
