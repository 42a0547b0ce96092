"""Compile the one-pass Triton kernels ahead of time for Hopper and Ampere; no GPU needed.

    python launchers/triton_compile_table.py --out results/triton/compile.md

Every shipped tile configuration (``plsh_dist.ops.tile_bands``: forward, and
the backward's dK/dV and dQ kernels) is compiled with ``triton.compile`` for
sm_90 (H100 / H200) and sm_80 (A100), bf16 and fp16 inputs, head dims 64 and
128, both biases (PLSH count and ALiBi window; causal, per-head, with
documents: the largest specialisation). Registers per thread, spill stores / loads
and stack frame come from ``ptxas -v`` on the PTX (Triton's bundled ptxas),
shared memory from Triton's metadata. A row fails when anything spills or the
shared memory exceeds the SM's limit (228 KiB on sm_90, 164 KiB on sm_80);
the exit status is 1 then.

Must run without ``TRITON_INTERPRET`` (the interpreter replaces the compiler).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plsh_dist.ops.tile_bands import tiles_for  # noqa: E402

#: Shared memory per SM available to one block (KiB), by compute capability.
SMEM_LIMIT_KIB = {90: 228, 80: 164}
ARCHS = (90, 80)
DTYPES = ("bf16", "fp16")
HEAD_DIMS = (64, 128)
KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")
MODES = {0: "count", 1: "window"}

def _signature(kernel: str, dtype: str) -> dict[str, str]:
    """Triton signature of one kernel: pointer types for ``dtype`` inputs, int32 scalars."""
    x = f"*{dtype}"
    tail = {"Pos": "*i32", "Doc": "*i32", "Pitch": "*fp64", "Shift": "*fp64", "Sigma": "*fp32", "Window": "*i64",
            "BandLo": "*i32", "BandHi": "*i32"}
    strides = lambda *names: {f"stride_{n}{a}": "i32" for n in names for a in ("b", "t", "h")}  # noqa: E731
    if kernel == "fwd":
        sig = {"Q": x, "K": x, "V": x, "Out": x, "Lse": "*fp32", **tail, **strides("q", "k", "v", "o")}
        ints = ["n_tokens", "num_q_heads", "group", "num_hh", "num_samples", "num_m_tiles"]
        return {**sig, **{n: "i32" for n in ints}, "scale_log2": "fp32"}
    grads = {"DK": x, "DV": x} if kernel == "bwd_dkdv" else {"DQ": x}
    sig = {"Q": x, "K": x, "V": x, "DO": x, "Lse": "*fp32", "Delta": "*fp32", **grads, **tail,
           **strides("q", "k", "v", "do"), **strides(*(["dk", "dv"] if kernel == "bwd_dkdv" else ["dq"]))}
    ints = (["n_tokens", "num_q_heads", "num_kv_heads", "group", "num_hh", "num_samples", "num_n_tiles"]
            if kernel == "bwd_dkdv" else ["n_tokens", "num_q_heads", "group", "num_hh", "num_samples", "num_m_tiles"])
    return {**sig, **{n: "i32" for n in ints}, "scale": "fp32", "scale_log2": "fp32"}


def _ptxas_report(ptx: str, arch: int) -> dict[str, int]:
    """Registers, spill stores / loads and stack frame of one kernel: ``ptxas -v`` (Triton's own
    ptxas, the same options as its compile) on the PTX."""
    import re

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        log = subprocess.run([str(tool), "-lineinfo", "-v", f"--gpu-name={gpu}", str(src), "-o", str(src) + ".o"],
                             capture_output=True, text=True, check=True).stderr
    num = lambda pattern: int(re.search(pattern, log).group(1))  # noqa: E731
    return {"regs": num(r"Used (\d+) registers"), "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"), "stack": num(r"(\d+) bytes stack frame")}


def compile_one(arch: int, dtype: str, head_dim: int, kernel: str, mode: int) -> dict:
    """Compile one specialisation; its resources and whether they fit."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from plsh_dist.ops import triton_onepass_kernels as K

    cfg = tiles_for(head_dim, arch // 10)[0 if kernel == "fwd" else 1]
    fn = {"fwd": K.onepass_fwd_kernel, "bwd_dkdv": K.onepass_bwd_dkdv_kernel, "bwd_dq": K.onepass_bwd_dq_kernel}[kernel]
    constexprs = {"HEAD_DIM": head_dim, "D_REAL": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                  "MODE": mode, "CAUSAL": True, "HAS_DOCS": True, "PER_HEAD": True, "IEEE": False}
    t0 = time.time()
    src = ASTSource(fn=fn, signature=_signature(kernel, dtype), constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    res = _ptxas_report(compiled.asm["ptx"], arch)
    smem = int(compiled.metadata.shared)
    ptx = compiled.asm["ptx"]
    row = {"arch": f"sm_{arch}", "dtype": dtype, "head_dim": head_dim, "kernel": kernel, "bias": MODES[mode],
           "tile": f"{cfg.block_m}x{cfg.block_n}", "warps": cfg.num_warps, "stages": cfg.num_stages, **res,
           "smem_kib": round(smem / 1024, 1), "compile_s": round(time.time() - t0, 1),
           "exact_f64_div": ("div.rn.f64" in ptx) if mode == 0 else None}
    problems = []
    if res["spill_stores"] or res["spill_loads"]:
        problems.append(f"spills ({res['spill_stores']} B stored, {res['spill_loads']} B loaded)")
    if smem > SMEM_LIMIT_KIB[arch] * 1024:
        problems.append(f"shared memory {smem / 1024:.1f} KiB > {SMEM_LIMIT_KIB[arch]} KiB")
    if mode == 0 and not row["exact_f64_div"]:
        problems.append("the bucket division is not IEEE div.rn.f64")
    row["ok"] = not problems
    row["problems"] = "; ".join(problems)
    return row


def all_specs(archs=ARCHS, dtypes=DTYPES, head_dims=HEAD_DIMS, kernels=KERNELS, modes=tuple(MODES)):
    return [(a, d, h, k, m) for a in archs for d in dtypes for h in head_dims for k in kernels for m in modes]


def compile_all(specs, workers: int) -> list[dict]:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("unset TRITON_INTERPRET: the interpreter does not compile")
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(compile_one, *zip(*specs)))


def markdown(rows: list[dict], command: str) -> str:
    import triton

    head = ("| arch | dtype | D | kernel | bias | tile | warps | stages | regs/thread | smem KiB | spill st/ld B | "
            "stack B | fits |")
    lines = [
        "# Triton one-pass kernels: ahead-of-time compile resources",
        "",
        f"Generated by `{command}` (Triton {triton.__version__}, no GPU: `triton.compile` for the target).",
        "Every kernel specialised causal, per-head bias, with documents (the largest variant).",
        f"Limits: no spill stores or loads; shared memory <= {SMEM_LIMIT_KIB[90]} KiB (sm_90), "
        f"{SMEM_LIMIT_KIB[80]} KiB (sm_80). The count bias's bucket division compiles to IEEE `div.rn.f64` "
        "(checked in the PTX), the arithmetic of `PositionalLSH`.",
        "",
        head,
        "|" + "|".join(["---"] * (head.count("|") - 1)) + "|",
    ]
    for r in rows:
        fits = "yes" if r["ok"] else f"**no**: {r['problems']}"
        lines.append(f"| {r['arch']} | {r['dtype']} | {r['head_dim']} | {r['kernel']} | {r['bias']} | {r['tile']} | "
                     f"{r['warps']} | {r['stages']} | {r['regs']} | {r['smem_kib']} | "
                     f"{r['spill_stores']}/{r['spill_loads']} | "
                     f"{r['stack']} | "
                     f"{fits} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="markdown table to write (default: print)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--arch", type=int, nargs="*", default=list(ARCHS))
    ap.add_argument("--dtype", nargs="*", default=list(DTYPES))
    ap.add_argument("--head-dim", type=int, nargs="*", default=list(HEAD_DIMS))
    args = ap.parse_args(argv)
    rows = compile_all(all_specs(args.arch, args.dtype, args.head_dim), args.workers)
    text = markdown(rows, "python launchers/triton_compile_table.py" + (f" --out {args.out}" if args.out else ""))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(f"FAIL {r['arch']} {r['dtype']} D={r['head_dim']} {r['kernel']} {r['bias']}: {r['problems']}",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
