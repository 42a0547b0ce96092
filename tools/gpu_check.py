"""GPU check in three stages, results in one folder: a smoke stage of minutes, the CUDA-graph
stage of minutes, then the full check.

    make gpu-check GPU_OUT=gpu_results          # or, where there is no make:
    python3 tools/gpu_check.py --out gpu_results [--stage smoke|graph|full|both|all]

Built for a GPU machine lent for about 15 minutes, machine start included, where
nothing can be downloaded: it uses the PyTorch and Triton already installed
there, and needs neither make, flash-attn, DeepSpeed nor datasets.

1. **smoke** (``tools/gpu_smoke.py``; under 4 minutes, first, and its
   ``smoke.json`` / ``smoke.md`` are written before the full stage starts):
   bf16 correctness of the fused kernel's three kernels against the fp64
   reference at two shapes, and forward + backward of the kernel against the
   causal SDPA floor (flash, and cuDNN where present) at 8k and 32k. Needs no
   pytest.
2. **graph** (``tools/gpu_graph.py``, in a child process killed
   ``--graph-budget-s`` + 60 s after it starts; about 3 minutes): one training step
   of the 0.6B model of ``configs/qwen3_0.6b_8k_plsh_s10.toml`` at 8k tokens, eager,
   with compiled layers, and captured in a CUDA graph replayed under
   ``torch.cuda.set_sync_debug_mode("error")``; the replay's loss and gradients
   against eager's, before and after a new step is written into the seed context's
   step tensor; every host sync of one eager step, by source line; then one decoder layer
   under SP = 2 (two ranks on the one GPU over gloo, ``tools/gpu_graph_sp.py``) captured
   the same way, or the reason it cannot be. Writes ``graph.json``; a failure (capture,
   sync, out of memory, a crash) is recorded there, and the full stage still runs.
3. **full**: the CUDA tests (pytest; said and skipped when pytest is not
   installed, within ``--tests-timeout-s``), the varlen planning cost, and the
   GPU benchmark (``benchmarks/bench_attention_gpu.py``) within
   ``--bench-budget-s``.

Without CUDA it runs the CPU-safe parts and says the GPU parts were skipped:
the smoke stage's correctness check at toy sizes under Triton's interpreter
(this script sets ``TRITON_INTERPRET=1`` before triton is imported when there
is no CUDA), the graph stage's eager and compiled steps on a toy model, the
CPU tests of the varlen path, the planning cost, and the benchmark's code at
toy sizes.

``--stage all`` (the default) runs smoke, graph, full in this order; ``both`` smoke then full.

Writes under ``--out``: ``smoke.json`` + ``smoke.md`` (smoke), ``graph.json`` (graph), ``check.json``
(environment, test outcomes, planning cost), ``pytest*.xml`` and
``bench/results.json`` + ``bench/results.md`` (full), and ``summary.txt``
(short, human: every stage that ran). Exit status 1 when a check or test failed, or
the graph stage did.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The GPU check sets its own path: it runs as `python3 tools/gpu_check.py` on a
# GPU machine where the package is not installed and nothing can be installed (docs/gpu.md).
sys.path.insert(0, str(ROOT))

GPU_TESTS = ["tests/ops/test_cuda_backends.py", "tests/ops/test_plsh_attention.py::test_cuda_backends_match_math_path",
             # the fused Triton kernel compiled on the GPU (bf16 too) against the fp64 reference
             "tests/ops/triton_kernel/test_triton_attention.py", "tests/ops/triton_kernel/test_triton_counts.py"]
CPU_SAFE_TESTS = ["tests/ops/test_varlen_strategy.py"]
#: Stages of each ``--stage`` value, in the order they run (smoke first: it is the shortest).
STAGES = {"smoke": ("smoke",), "graph": ("graph",), "full": ("full",), "both": ("smoke", "full"),
          "all": ("smoke", "graph", "full")}
#: Seconds the graph stage's process gets past its own budget before it is killed.
GRAPH_GRACE_S = 60.0


def environment() -> dict:
    import torch

    from plsh_dist.ops.backends import flash_attn_available

    cuda = torch.cuda.is_available()
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cuda_available": cuda, "device": torch.cuda.get_device_name() if cuda else "CPU"}
    env["flash_attn"] = bool(cuda and flash_attn_available(torch.device("cuda"), torch.bfloat16))
    return env


def pytest_status() -> str | None:
    """None when pytest can be imported, else why the tests are skipped."""
    if importlib.util.find_spec("pytest") is None:
        return "pytest is not installed: the tests were skipped (the smoke stage needs no pytest)"
    return None


def run_pytest(paths: list[str], xml_path: Path, timeout_s: float) -> dict:
    """Run pytest on ``paths``; outcome counts and failures from its JUnit XML. A run past
    ``timeout_s`` is killed and counted as a failure."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml_path}", *paths]
    t0 = time.time()
    result = {"command": " ".join(cmd[2:]), "exit_code": None, "wall_s": 0.0, "passed": 0, "failed": 0,
              "skipped": 0, "failures": [], "skip_reasons": []}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        result.update(exit_code=-1, wall_s=round(time.time() - t0, 1), failed=1,
                      failures=[f"timed out after {timeout_s:.0f} s (--tests-timeout-s)"])
        return result
    result.update(exit_code=proc.returncode, wall_s=round(time.time() - t0, 1))
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
    from plsh_dist.ops.varlen.calls import varlen_calls

    device = torch.device("cuda" if device_name != "CPU" else "cpu")
    rows = []
    for T in ((8192, 32768, 131072) if device.type == "cuda" else (8192, 32768)):
        for sigma_name, sigma in (("per_head", alibi_slopes(16).reciprocal()), ("256", 256.0)):
            lsh = PositionalLSH(sigma, 8, seed=0)
            varlen_calls(lsh, torch.arange(T), 1, device)  # warm-up
            times = []
            for _ in range(3):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                plan = varlen_calls(lsh, torch.arange(T), 1, device)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            calls = sum(len(chunks) for chunks in plan)
            blocks = sum(c.cu_seqlens.numel() - 1 for chunks in plan for c in chunks)
            rows.append({"T": T, "sigma": sigma_name, "s": 8, "plan_ms": round(sorted(times)[1] * 1e3, 2),
                         "varlen_calls": calls, "blocks": blocks})
    return rows


def summary_text(env: dict, smoke: dict | None, full: dict | None, graph: dict | None = None) -> str:
    """The human summary of whichever stages ran."""
    lines = [f"plsh_dist gpu-check on {env['device']} (torch {env['torch']}, CUDA {env['cuda']})"]
    if not env["cuda_available"]:
        lines.append("NO CUDA: only the CPU-safe parts ran; every GPU part is skipped, nothing GPU is measured.")
    if smoke is not None:
        lines.append(f"smoke stage ({smoke['wall_s']} s, smoke.md): {'ok' if smoke['ok'] else 'FAILED'}")
        lines += [f"  SKIPPED {s}" for s in smoke["skipped"]]
        for c in smoke["correctness"]:
            bad = [name for name, o in c["outputs"].items() if not o["ok"]]
            lines.append(f"  {c['case']} {c['dtype']} on {c['device']}: " + (f"FAILED {bad}" if bad else "ok"))
        for r in smoke["timings"]:
            lines.append(f"  T={r['T']:>6} {r['method']:<24} " + (f"{r['time_ms']:9.3f} ms" if r["status"] == "ok"
                                                                  else r["status"]))
    if graph is not None:  # the lines gpu_graph.py wrote with its results (run_graph_stage: how its process ended)
        lines += graph["summary"]
    if full is not None:
        lines += _full_summary(env, full)
    return "\n".join(lines) + "\n"


def _full_summary(env: dict, full: dict) -> list[str]:
    lines = ["full stage:", "flash-attn: " + ("available, its cases ran" if env["flash_attn"] else
                                              "NOT importable: flash_attn cases skipped; the torch (aten varlen) "
                                              "backend ran")]
    if full["pytest"] is not None:
        lines.append(f"tests: {full['pytest']}")
    for name, res in full["tests"].items():
        lines.append(f"tests [{name}]: {res['passed']} passed, {res['failed']} failed, {res['skipped']} skipped "
                     f"({res['wall_s']} s)")
        lines += [f"  FAILED {f}" for f in res["failures"]]
    lines.append("varlen planning per forward (s = 8, batch 1, 16 heads):")
    lines += [f"  T={p['T']:>6} sigma={p['sigma']:<8} {p['plan_ms']:8.2f} ms  {p['varlen_calls']} calls, "
              f"{p['blocks']} blocks" for p in full["planning"]]
    bench = full["bench"]
    if bench:
        ok = [r for r in bench["records"] if r.get("status") == "ok"]
        lines.append(f"benchmark: {len(ok)} of {len(bench['records'])} cases measured (bench/results.md)")
        for r in ok:
            if r["method"] in ("plsh_torch_perhead_s8", "plsh_triton_perhead_s8") or not r["method"].startswith("plsh"):
                lines.append(f"  T={r['T']:>7} {r['method']:<30} {r['time_s'] * 1e3:9.2f} ms  "
                             f"x{r.get('speedup_vs_floor', float('nan')):.2f} vs floor  {r['tflops']:.3g} TFLOP/s "
                             f"useful, {r.get('tflops_visited', float('nan')):.3g} visited")
        lines.append("GPU targets: " + "; ".join(f"{name}: {verdict}" for name, verdict in bench.get("targets", [])))
    return lines


def run_full(env: dict, out: Path, args) -> dict:
    """The full stage: tests (when pytest is there), planning cost, benchmark (unless ``--skip-bench``)."""
    why = pytest_status()
    tests = {}
    if why is None:
        tests["cpu-safe"] = run_pytest(CPU_SAFE_TESTS, out / "pytest_cpu_safe.xml", args.tests_timeout_s)
        tests["gpu"] = run_pytest(GPU_TESTS, out / "pytest.xml", args.tests_timeout_s)
        print(json.dumps({k: {x: v[x] for x in ("passed", "failed", "skipped")} for k, v in tests.items()}), flush=True)
    else:
        print(why, flush=True)
    plans = planning_cost(env["device"] if env["cuda_available"] else "CPU")
    bench = None
    if not args.skip_bench:
        bench_attention_gpu = _load_script("benchmarks/bench_attention_gpu.py")
        bench_args = ["--out", str(out / "bench"), "--budget-s", str(args.bench_budget_s)]
        if not env["cuda_available"]:  # exercise the code paths at toy sizes
            bench_args += ["--lengths", "512", "--heads", "2", "--head-dim", "16", "--samples", "4",
                           "--window", "64", "--repeats", "1", "--no-flex"]
        bench_attention_gpu.main(bench_args)
        bench = json.loads((out / "bench" / "results.json").read_text())
    (out / "check.json").write_text(json.dumps({"environment": env, "pytest": why, "tests": tests, "planning": plans},
                                               indent=1))
    return {"pytest": why, "tests": tests, "planning": plans, "bench": bench}


def run_graph_stage(out: Path, budget_s: float) -> dict:
    """``tools/gpu_graph.py`` in a child process (a crash or a poisoned CUDA context stays there),
    killed ``GRAPH_GRACE_S`` after its budget; its ``graph.json``, with how the process ended when it
    did not end by itself (what it wrote before stays)."""
    path = out / "graph.json"
    path.unlink(missing_ok=True)
    limit = budget_s + GRAPH_GRACE_S
    cmd = [sys.executable, str(ROOT / "tools" / "gpu_graph.py"), "--out", str(out), "--budget-s", str(budget_s)]
    ended = None
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
        output = proc.stdout + proc.stderr
        if proc.returncode not in (0, 1):
            ended = f"the process ended with exit status {proc.returncode}: {output[-1500:]}"
    except subprocess.TimeoutExpired as exc:
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                         for x in (exc.stdout, exc.stderr))
        ended = f"killed after {limit:g} s (--graph-budget-s {budget_s:g} + {GRAPH_GRACE_S:g})"
    print(output[-6000:], flush=True)
    result = json.loads(path.read_text()) if path.is_file() else {
        "cuda": None, "skipped": [], "failures": {}, "sync_sites": {}, "times": {}, "checks": {}, "ratios": {}}
    if ended is not None or not path.is_file():
        ended = ended or f"no graph.json was written: {output[-1500:]}"
        result["failures"]["process"] = {"error": ended, "chain": []}
        result["ok"] = False
        # what the process wrote before, under a first line that says how it ended
        result["summary"] = [f"graph stage (graph.json): FAILED process: {ended[:1500]}",
                             *result.get("summary", [])[1:]]
        path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _interpret_without_cuda() -> None:
    """Without CUDA, Triton's CPU interpreter for the kernel's checks: ``TRITON_INTERPRET=1`` must be
    set before triton is imported (as ``tests/conftest.py`` does)."""
    import torch

    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _load_script(path: str):
    """The script at ``path`` (from the repository root) as a module (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True,
                   help="folder for smoke.{json,md}, summary.txt, check.json, pytest*.xml, bench/")
    p.add_argument("--stage", choices=tuple(STAGES), default="all",
                   help="smoke: the kernel's bf16 check and two timings (minutes); graph: one training step of the "
                        "0.6B model at 8k eager, compiled and in a CUDA graph (minutes); full: tests + benchmark; "
                        "both: smoke, then full; all: smoke, graph, full")
    p.add_argument("--graph-budget-s", type=float, default=170.0,
                   help="the graph stage starts no part past this; its process is killed 60 s later")
    p.add_argument("--bench-budget-s", type=float, default=200.0,
                   help="time budget of the benchmark grid (the cases past it are skipped and recorded)")
    p.add_argument("--tests-timeout-s", type=float, default=240.0, help="each pytest run is killed past this")
    p.add_argument("--skip-bench", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _interpret_without_cuda()

    env = environment()
    print(json.dumps(env), flush=True)
    smoke = full = graph = None
    stages = STAGES[args.stage]
    if "smoke" in stages:
        smoke = _load_script("tools/gpu_smoke.py").run_smoke(out)  # written before the full stage starts
        (out / "summary.txt").write_text(summary_text(env, smoke, None))
        print(f"smoke stage: {'ok' if smoke['ok'] else 'FAILED'} in {smoke['wall_s']} s ({out / 'smoke.md'})",
              flush=True)
    if "graph" in stages:
        graph = run_graph_stage(out, args.graph_budget_s)
        (out / "summary.txt").write_text(summary_text(env, smoke, None, graph))
        print(f"graph stage: {'ok' if graph.get('ok') else 'FAILED'} ({out / 'graph.json'})", flush=True)
    if "full" in stages:
        full = run_full(env, out, args)
    text = summary_text(env, smoke, full, graph)
    (out / "summary.txt").write_text(text)
    print(text)
    failed = (smoke is not None and not smoke["ok"]) or (graph is not None and not graph.get("ok"))
    if full is not None:
        failed |= any(res["failed"] or res["exit_code"] not in (0, 5) for res in full["tests"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
