"""GPU check: the CUDA tests and the GPU benchmark in one run, results in one folder.

    make gpu-check GPU_OUT=gpu_results          # or:
    python launchers/gpu_check.py --out gpu_results [--bench-budget-s 300]

Built for a GPU machine where nothing can be downloaded: it uses the
PyTorch already installed there (``make gpu-check`` installs this package
with ``--no-deps``), needs only pytest besides, and skips the flash-attn
cases when flash-attn is not importable (the summary says so). Without CUDA
it still runs its CPU-safe parts: the CPU tests of the varlen path (row
layouts, chunking, merging around the kernels), the host-side planning cost,
and the benchmark's code paths at toy sizes.

Writes under ``--out``: ``summary.txt`` (short, human), ``check.json``
(environment, test outcomes, planning cost), ``pytest.xml`` and
``bench/results.json`` + ``bench/results.md``. Exit status 1 when a test failed.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPU_TESTS = ["tests/ops/test_cuda_backends.py", "tests/ops/test_plsh_attention.py::test_cuda_backends_match_math_path",
             # the fused Triton kernel compiled on the GPU (bf16 too) against the fp64 reference
             "tests/ops/triton_kernel/test_triton_attention.py", "tests/ops/triton_kernel/test_triton_counts.py"]
CPU_SAFE_TESTS = ["tests/ops/test_varlen_path.py"]


def environment() -> dict:
    import torch

    from plsh_dist.ops.backends import flash_attn_available

    cuda = torch.cuda.is_available()
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cuda_available": cuda, "device": torch.cuda.get_device_name() if cuda else "CPU"}
    env["flash_attn"] = bool(cuda and flash_attn_available(torch.device("cuda"), torch.bfloat16))
    return env


def run_pytest(paths: list[str], xml_path: Path, timeout_s: int) -> dict:
    """Run pytest on ``paths``; outcome counts and failures from its JUnit XML."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml_path}", *paths]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    result = {"command": " ".join(cmd[2:]), "exit_code": proc.returncode, "wall_s": round(time.time() - t0, 1),
              "passed": 0, "failed": 0, "skipped": 0, "failures": [], "skip_reasons": []}
    if not xml_path.is_file():
        result["failures"].append(proc.stdout[-3000:] + proc.stderr[-3000:])
        return result
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            result["failed"] += 1
            result["failures"].append(f"{name}: {(failure.get('message') or '')[:500]}")
        elif skipped is not None:
            result["skipped"] += 1
            result["skip_reasons"].append(f"{name}: {skipped.get('message')}")
        else:
            result["passed"] += 1
    return result


def planning_cost(device_name: str) -> list[dict]:
    """Time of the varlen plan (buckets on the device, block starts back to the host):
    the op's host-side work per forward, for per-head sigma (worst case) and s = 8."""
    import torch

    from plsh_dist.hashing import PositionalLSH, alibi_slopes
    from plsh_dist.ops.varlen_plan import plan_samples

    device = torch.device("cuda" if device_name != "CPU" else "cpu")
    rows = []
    for T in ((8192, 32768, 131072) if device.type == "cuda" else (8192, 32768)):
        for sigma_name, sigma in (("per_head", alibi_slopes(16).reciprocal()), ("256", 256.0)):
            lsh = PositionalLSH(sigma, 8, seed=0)
            plan_samples(lsh, torch.arange(T), 1, device)  # warm-up
            times = []
            for _ in range(3):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                plan = plan_samples(lsh, torch.arange(T), 1, device)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            calls = sum(len(chunks) for chunks in plan)
            blocks = sum(c.cu_seqlens.numel() - 1 for chunks in plan for c in chunks)
            rows.append({"T": T, "sigma": sigma_name, "s": 8, "plan_ms": round(sorted(times)[1] * 1e3, 2),
                         "varlen_calls": calls, "blocks": blocks})
    return rows


def summary_text(env: dict, tests: dict, plans: list[dict], bench: dict | None) -> str:
    lines = [f"plsh_dist gpu-check on {env['device']} (torch {env['torch']}, CUDA {env['cuda']})"]
    if not env["cuda_available"]:
        lines.append("NO CUDA: only the CPU-safe parts ran; every GPU case below is skipped, nothing GPU is measured.")
    lines.append("flash-attn: " + ("available, its cases ran" if env["flash_attn"]
                                   else "NOT importable: flash_attn cases skipped; the torch (aten varlen) backend ran"))
    for name, res in tests.items():
        lines.append(f"tests [{name}]: {res['passed']} passed, {res['failed']} failed, {res['skipped']} skipped "
                     f"({res['wall_s']} s)")
        lines += [f"  FAILED {f}" for f in res["failures"]]
    lines.append("varlen planning per forward (s = 8, batch 1, 16 heads):")
    lines += [f"  T={p['T']:>6} sigma={p['sigma']:<8} {p['plan_ms']:8.2f} ms  {p['varlen_calls']} calls, "
              f"{p['blocks']} blocks" for p in plans]
    if bench:
        ok = [r for r in bench["records"] if r.get("status") == "ok"]
        lines.append(f"benchmark: {len(ok)} of {len(bench['records'])} cases measured (bench/results.md)")
        for r in ok:
            if r["method"] in ("plsh_torch_perhead_s8", "plsh_triton_perhead_s8") or not r["method"].startswith("plsh"):
                lines.append(f"  T={r['T']:>7} {r['method']:<30} {r['time_s'] * 1e3:9.2f} ms  "
                             f"x{r.get('speedup_vs_floor', float('nan')):.2f} vs floor  {r['tflops']:.3g} TFLOP/s "
                             f"useful, {r.get('tflops_visited', float('nan')):.3g} visited")
        lines.append("GPU targets: " + "; ".join(f"{name}: {verdict}" for name, verdict in bench.get("targets", [])))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for summary.txt, check.json, pytest.xml, bench/")
    p.add_argument("--bench-budget-s", type=float, default=200.0,
                   help="time budget of the benchmark grid (the whole check aims at 8 minutes on one H200)")
    p.add_argument("--skip-bench", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    env = environment()
    print(json.dumps(env), flush=True)
    tests = {"cpu-safe": run_pytest(CPU_SAFE_TESTS, out / "pytest_cpu_safe.xml", 900)}
    tests["gpu"] = run_pytest(GPU_TESTS, out / "pytest.xml", 900)
    print(json.dumps({k: {x: v[x] for x in ("passed", "failed", "skipped")} for k, v in tests.items()}), flush=True)
    plans = planning_cost(env["device"] if env["cuda_available"] else "CPU")

    bench = None
    if not args.skip_bench:
        import importlib.util

        spec = importlib.util.spec_from_file_location("bench_attention_gpu", ROOT / "launchers" / "bench_attention_gpu.py")
        bench_attention_gpu = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_attention_gpu)
        bench_args = ["--out", str(out / "bench"), "--budget-s", str(args.bench_budget_s)]
        if not env["cuda_available"]:  # exercise the code paths at toy sizes
            bench_args += ["--lengths", "512", "--heads", "2", "--head-dim", "16", "--samples", "4",
                           "--window", "64", "--repeats", "1", "--no-flex"]
        bench_attention_gpu.main(bench_args)
        bench = json.loads((out / "bench" / "results.json").read_text())

    (out / "check.json").write_text(json.dumps({"environment": env, "tests": tests, "planning": plans}, indent=1))
    text = summary_text(env, tests, plans, bench)
    (out / "summary.txt").write_text(text)
    print(text)
    return 1 if any(res["failed"] or res["exit_code"] not in (0, 5) for res in tests.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
