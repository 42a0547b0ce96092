"""Do the pinned CPU code paths (plsh_dist.cpu_paths) give the same bits on other CPUs?

    python experiments/cpu_paths.py --out results/cpu_paths [--qemu Haswell,Skylake-Client]

Runs one probe per variant, each in its own process: torch's CPU ops that
training uses (GEMM, softmax, SDPA, sqrt, ...) on fixed inputs, and two
optimizer steps of the tiny Qwen3 with PLSH attention (fused AdamW, as
trained, and foreach AdamW, the earlier optimizer), each reduced to a hash of
its bits. The variants are this CPU with torch's own choices, with one choice
forced at a time, pinned, and pinned with AVX-512 hidden from glibc and MKL;
with ``--qemu``, the same probe under QEMU's user-mode emulation of other
x86-64 CPU models (``qemu-x86_64 -cpu MODEL``: another vendor string, no
AVX-512, exact emulation of the approximate instructions), which is the one
way to run other CPUs' code paths on one machine. Every variant is compared
with "this CPU, pinned". Writes ``probes.md`` (the table) and ``probes.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plsh_dist.cpu_paths import PINNED_CPU_ENV  # noqa: E402  (imports no torch)

NO_AVX512 = {"MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512BW,-AVX512CD,-AVX512DQ,-AVX512VL"}


def _digest(t) -> str:
    import torch

    t = t.detach()
    t = t.float() if t.dtype == torch.bfloat16 else t  # numpy has no bf16; the cast is exact
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:12]


def probe() -> dict:
    """The bits of training's CPU ops and of two optimizer steps, as hashes (runs in a child)."""
    import torch
    import torch.nn.functional as F

    from plsh_dist.cpu_paths import code_paths

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 128, generator=g), torch.randn(128, 384, generator=g)
    x = torch.randn(4, 128, 4, 32, generator=g)
    ops = {"mm (MKL GEMM)": a @ b, "bmm": torch.bmm(a.view(4, 128, 128), b[:, :128].expand(4, 128, 128)),
           "softmax": torch.softmax(a, -1), "logsumexp": torch.logsumexp(a, -1),
           "sdpa (causal)": F.scaled_dot_product_attention(x, 0.5 * x, x, is_causal=True),
           "exp": a.exp(), "log": (a.abs() + 1).log(), "sqrt (MKL VML)": a.abs().sqrt(),
           "rsqrt": (a.abs() + 1).rsqrt(), "silu": F.silu(a), "sum": a.sum(),
           "cross_entropy": F.cross_entropy(a, torch.arange(512) % 128), "vector_norm": torch.linalg.vector_norm(a)}
    ab, bb, xb = a.bfloat16(), b.bfloat16(), x.bfloat16().transpose(1, 2)
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bf16 = {"mm bf16": lambda: ab @ bb, "linear bf16": lambda: F.linear(ab, bb.t()),
            "softmax bf16": lambda: torch.softmax(ab, -1), "silu bf16": lambda: F.silu(ab),
            "rms_norm bf16": lambda: F.rms_norm(ab, (128,)),
            "sdpa bf16 (aten CPU flash)": lambda: sdpa(xb, 0.5 * xb, xb, 0.0, True)[0],
            "sdpa bf16 backward": lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                xb, xb, 0.5 * xb, xb, *sdpa(xb, 0.5 * xb, xb, 0.0, True), 0.0, True)[1]}
    result = {"code_paths": code_paths(), "ops": {k: _digest(v) for k, v in ops.items()}, "model": {}}
    for name, op in bf16.items():  # some mixes of forced paths make torch's bf16 kernels refuse to run
        try:
            result["ops"][name] = _digest(op())
        except RuntimeError as exc:
            result["ops"][name] = f"error: {str(exc).splitlines()[0]}"
    for fused, dtype in ((True, torch.float32), (False, torch.float32), (True, torch.bfloat16)):
        name = "bf16 weights, fused AdamW, no clipping" if dtype == torch.bfloat16 else (
            "fused AdamW" if fused else "foreach AdamW")
        try:
            result["model"][name] = _two_steps(fused, dtype)
        except RuntimeError as exc:
            result["model"][name] = {"steps": [], "weights": f"error: {str(exc).splitlines()[0]}"}
    return result


def _two_steps(fused: bool, dtype) -> dict:
    """Two optimizer steps of the tiny Qwen3 with PLSH attention in ``dtype`` (fp32: clipped at 1,
    as trained; bf16: unclipped, as the bf16 golden runs) -> losses, norms, the final weights' hash."""
    import torch

    from plsh_dist.models.build import build_model
    from plsh_dist.models.config import AttentionConfig, ModelConfig

    torch.manual_seed(0)
    model = build_model(ModelConfig.from_dict({"preset": "tiny", "vocab_size": 2048}),
                        AttentionConfig(bias="plsh", rope=False, num_samples=4), dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=fused, foreach=not fused)
    tokens = torch.Generator().manual_seed(1)
    steps = []
    for _ in range(2):
        ids = torch.randint(0, 2048, (4, 128), generator=tokens)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if dtype == torch.float32:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        opt.step()
        opt.zero_grad()
        steps.append((loss.item(), norm.item()))
    weights = hashlib.sha256(b"".join(p.detach().float().numpy().tobytes() for p in model.parameters())).hexdigest()
    return {"steps": steps, "weights": weights[:12]}


def variants(qemu_models: list[str]) -> list[tuple[str, dict[str, str], list[str]]]:
    """(name, environment overrides, command prefix) of each probe."""
    out = [("this CPU, torch's own choice", {}, []),
           ("this CPU, ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}, []),
           ("this CPU, ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, []),
           ("this CPU, MKL_CBWR=COMPATIBLE", {"MKL_CBWR": "COMPATIBLE"}, []),
           ("this CPU, pinned", dict(PINNED_CPU_ENV), []),
           ("this CPU, pinned, AVX-512 hidden from glibc and MKL", {**PINNED_CPU_ENV, **NO_AVX512}, [])]
    for model in qemu_models:
        out += [(f"emulated {model}, torch's own choice", {}, ["qemu-x86_64", "-cpu", model]),
                (f"emulated {model}, pinned", dict(PINNED_CPU_ENV), ["qemu-x86_64", "-cpu", model])]
    return out


def run_probe(overrides: dict[str, str], prefix: list[str]) -> tuple[dict, float]:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_CPU_ENV}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **overrides})
    t0 = time.time()
    done = subprocess.run([*prefix, sys.executable, __file__, "--probe"], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.splitlines()[-1]), time.time() - t0


def _model_bits(run: dict, reference: dict) -> str:
    """One model probe against the reference's: same bits, its step-2 norm where it differs, or its error."""
    if run["weights"].startswith("error:"):
        return run["weights"]
    if run["weights"] == reference["weights"]:
        return "same bits"
    return f"differ (step-2 grad norm {run['steps'][1][1]:.9g})"


def report(rows: list[tuple[str, dict, float | None]], reference: dict) -> str:
    lines = ["| variant | ATen / MKL branch | ops whose bits differ from this CPU, pinned | two steps, fused AdamW "
             "(as trained) | two steps, foreach AdamW | two steps, bf16 weights (fused AdamW, no clipping) | "
             "probe time |", "|---|---|---|---|---|---|---|"]
    for name, res, seconds in rows:
        paths = f"{res['code_paths']['aten_cpu_capability']} / {res['code_paths']['mkl_cbwr']}"
        ops = [k for k, v in res["ops"].items() if v != reference["ops"][k]]
        same = {k: _model_bits(v, reference["model"][k]) for k, v in res["model"].items()}
        took = "-" if seconds is None else f"{seconds:.0f} s"
        lines.append(f"| {name} | {paths} | {', '.join(ops) or 'none'} | {same['fused AdamW']} | "
                     f"{same['foreach AdamW']} | {same['bf16 weights, fused AdamW, no clipping']} | {took} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/cpu_paths"))
    parser.add_argument("--qemu", default="", help="comma-separated QEMU CPU models, e.g. Haswell,Skylake-Client")
    parser.add_argument("--tables-only", action="store_true", help="probe nothing: rewrite probes.md from --out's "
                        "probes.json (probe times where it records them)")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe()))
        return 0
    if args.tables_only:
        rows = [(r.pop("variant"), r, r.pop("seconds", None))
                for r in json.loads((args.out / "probes.json").read_text())]
        _write_report(args, rows, "")
        return 0
    models = [m for m in args.qemu.split(",") if m]
    if models and shutil.which("qemu-x86_64") is None:
        print("--qemu needs qemu-x86_64 (Debian's qemu-user)", file=sys.stderr)
        return 2
    rows = []
    for name, overrides, prefix in variants(models):
        res, seconds = run_probe(overrides, prefix)
        rows.append((name, res, seconds))
        print(f"{name}: {res['code_paths']} ({seconds:.0f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probes.json").write_text(
        json.dumps([{"variant": n, **r, "seconds": round(t, 1)} for n, r, t in rows], indent=1) + "\n")
    _write_report(args, rows, f"{' --qemu ' + args.qemu if models else ''}")
    return 0


def _write_report(args, rows: list[tuple[str, dict, float | None]], qemu_flag: str) -> None:
    """``probes.md`` in ``--out``: the table against "this CPU, pinned", and where it was probed."""
    reference = next(res for name, res, _ in rows if name == "this CPU, pinned")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    table = report(rows, reference)
    (args.out / "probes.md").write_text(f"Probes on {cpu}; command: `python experiments/cpu_paths.py "
                                        f"--out {args.out}{qemu_flag}`\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    sys.exit(main())
