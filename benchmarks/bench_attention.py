"""Attention benchmark: forward+backward time and peak memory per method and length.

    python benchmarks/bench_attention.py --out bench_results/attention        # full grid
    python benchmarks/bench_attention.py --lengths 2048,4096 --repeats 3     # quick

Methods: PLSH per sample (``plsh_s{4,8,20}``: s block attentions merged by
log-sum-exp) and in one pass (``onepass_s{4,8,20,64,100}``: one attention with
the bias log c_ij), truncated ALiBi at the one pass's cost (``truncated_s{8,20}``:
exact ALiBi on ``ceil((ln s + 0.58) sigma_h)`` keys per head), fixed blocks,
windowed exact ALiBi, exact ALiBi in query
chunks, dense ALiBi with a float bias through SDPA (while the (H, T, T) bias
fits), and causal SDPA without any bias (the exact-attention floor). H = 8,
D = 64, per-head sigma = 1 / slope, fp32, batch 1, one thread by default.

Each (method, T) runs in a fresh subprocess so that its peak RSS (``ru_maxrss``)
is its own; memory is reported as peak RSS minus the RSS after the inputs
were made. Time is the median of ``--repeats`` forward+backward passes after
one warm-up. Writes ``results.json`` (one record per method and T), a
markdown table and a log-log PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


METHODS = ["plsh_s4", "plsh_s8", "plsh_s20", "onepass_s4", "onepass_s8", "onepass_s20", "onepass_s64",
           "onepass_s100", "truncated_s8", "truncated_s20", "fixed_blocks", "window_alibi", "alibi_chunked",
           "alibi_dense_sdpa", "sdpa_causal"]
EXACT = {"alibi_chunked", "alibi_dense_sdpa", "sdpa_causal"}


def _attention_fn(method: str, num_heads: int, window: int):
    """method name -> callable(q, k, v) -> out, all in (B, T, H, D)."""
    import torch

    from plsh_dist.hashing import alibi_slopes
    from plsh_dist.ops import alibi_attention, fixed_blocks_attention, plsh_attention
    from plsh_dist.ops.alibi import equal_cost_c, truncation_windows

    slopes = alibi_slopes(num_heads)
    sigma = slopes.reciprocal()
    for prefix, how in (("plsh_s", "per_sample"), ("onepass_s", "onepass")):
        if method.startswith(prefix):
            s = int(method[len(prefix):])
            return lambda q, k, v: plsh_attention(q, k, v, sigma=sigma, num_samples=s, seed=0, method=how)
    if method.startswith("truncated_s"):
        window = truncation_windows(equal_cost_c(int(method[len("truncated_s"):])), sigma)
        return lambda q, k, v: alibi_attention(q, k, v, slopes=slopes, window=window)
    if method == "fixed_blocks":
        return lambda q, k, v: fixed_blocks_attention(q, k, v, sigma=sigma)
    if method == "window_alibi":
        return lambda q, k, v: alibi_attention(q, k, v, slopes=slopes, window=window)
    if method == "alibi_chunked":
        return lambda q, k, v: alibi_attention(q, k, v, slopes=slopes)
    if method == "alibi_dense_sdpa":
        def dense(q, k, v):
            T = q.shape[1]
            pos = torch.arange(T, dtype=torch.float32)
            bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()
            bias = bias.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias[None]
            )
            return out.transpose(1, 2)
        return dense
    if method == "sdpa_causal":
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2)
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def measure_one(method: str, T: int, H: int, D: int, repeats: int, window: int, threads: int) -> dict:
    """Run in this process: median fwd+bwd seconds and peak RSS growth in MiB."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, T, H, D, requires_grad=True) for _ in range(3))
    fn = _attention_fn(method, H, window)
    rss_inputs_kib = _current_rss_kib()
    times = []
    for i in range(repeats + 1):
        q.grad = k.grad = v.grad = None
        t0 = time.perf_counter()
        fn(q, k, v).sum().backward()
        if i:  # the first pass is a warm-up
            times.append(time.perf_counter() - t0)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "method": method, "T": T, "H": H, "D": D, "repeats": repeats,
        "median_s": statistics.median(times), "times_s": times,
        "peak_mem_mib": max(0.0, (peak_kib - rss_inputs_kib) / 1024),
        "threads": torch.get_num_threads(),
    }


def _current_rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _run_subprocess(method, T, args) -> dict:
    cmd = [sys.executable, __file__, "--one", method, "--lengths", str(T), "--heads", str(args.heads),
           "--head-dim", str(args.head_dim), "--repeats", str(args.repeats), "--window", str(args.window),
           "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"method": method, "T": T, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown_table(records: list[dict]) -> str:
    lengths = sorted({r["T"] for r in records})
    methods = [m for m in METHODS if any(r["method"] == m for r in records)]
    cell = {(r["method"], r["T"]): r for r in records}
    head = "| method | " + " | ".join(f"T={t}" for t in lengths) + " |"
    lines = [head, "|" + "---|" * (len(lengths) + 1)]
    for m in methods:
        row = []
        for t in lengths:
            r = cell.get((m, t))
            if r is None:
                row.append("-")
            elif "error" in r or "skipped" in r:
                row.append(r.get("skipped", "error"))
            else:
                row.append(f"{r['median_s']:.3g} s / {r['peak_mem_mib']:.0f} MiB")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _floor_time(t: dict, T: int) -> tuple[float | None, str]:
    """Causal SDPA's time at T: measured, or extrapolated by T^2 from the longest measured length."""
    if ("sdpa_causal", T) in t:
        return t[("sdpa_causal", T)], ""
    measured = sorted(L for (m, L) in t if m == "sdpa_causal" and L < T)
    if not measured:
        return None, ""
    L = measured[-1]
    return t[("sdpa_causal", L)] * (T / L) ** 2, f" (floor extrapolated from T={L} by T^2)"


def summary(records: list[dict]) -> list[str]:
    """Ratios of this run's side-by-side figures: PLSH against the floor and per sample, s = 100
    against s = 8, and truncated ALiBi against PLSH at equal cost."""
    t = {(r["method"], r["T"]): r["median_s"] for r in records if "median_s" in r}
    m = {(r["method"], r["T"]): r["peak_mem_mib"] for r in records if "peak_mem_mib" in r}
    out = []

    def ratio(a, b, T):
        return t[(b, T)] / t[(a, T)] if (a, T) in t and (b, T) in t else None

    for T in sorted({r["T"] for r in records}):
        floor, note = _floor_time(t, T)
        for name in ("onepass_s8", "plsh_s8"):
            if (name, T) in t and floor is not None:
                out.append(f"T={T}: {name} is {floor / t[(name, T)]:.2f}x faster than causal SDPA{note}")
        r = ratio("onepass_s8", "plsh_s8", T)
        if r is not None:
            out.append(f"T={T}: onepass_s8 is {r:.2f}x faster than plsh_s8 (per sample)")
        r = ratio("onepass_s8", "onepass_s100", T)
        if r is not None:
            out.append(f"T={T}: onepass_s100 takes {r:.2f}x the time of onepass_s8")
        for s in (8, 20):  # the equal-cost comparison: truncated ALiBi against PLSH's one pass at s
            r = ratio(f"onepass_s{s}", f"truncated_s{s}", T)
            if r is not None:
                out.append(f"T={T}: truncated_s{s} takes {r:.2f}x the time of onepass_s{s}")
            r = ratio(f"truncated_s{s}", "alibi_chunked", T)
            if r is not None:
                out.append(f"T={T}: alibi_chunked takes {r:.1f}x the time of truncated_s{s}")
        if ("onepass_s8", T) in m and ("onepass_s100", T) in m:
            out.append(f"T={T}: peak memory onepass_s8 {m[('onepass_s8', T)]:.0f} MiB, "
                       f"onepass_s100 {m[('onepass_s100', T)]:.0f} MiB")
    return out


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    colors = plt.get_cmap("tab20").colors  # 13 methods: the default 10-colour cycle would repeat
    for i, mth in enumerate(METHODS):
        pts = sorted((r["T"], r["median_s"]) for r in records if r["method"] == mth and "median_s" in r)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=mth, color=colors[i % len(colors)],
                    linestyle="--" if mth in EXACT else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("forward + backward time (s), median")
    threads = records[0].get("threads", "?") if records else "?"
    ax.set_title(f"Attention fwd+bwd on CPU (H=8, D=64, fp32, {threads} thread(s))")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="2048,4096,8192,16384,32768,65536")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--window", type=int, default=512, help="window of windowed ALiBi")
    p.add_argument("--max-exact-len", type=int, default=32768,
                   help="skip exact O(T^2) methods above this length (they take minutes per pass on 2 cores); "
                        "the summary extrapolates the floor beyond it by T^2 and says so")
    p.add_argument("--max-dense-len", type=int, default=8192, help="largest T for the dense (H, T, T) bias")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per (method, T) subprocess")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per measurement (0: torch's default). PLSH runs many small "
                        "kernels: on a core shared with another busy process, OpenMP barriers make "
                        "multi-threaded runs of it slow, so compare methods at the same thread count")
    p.add_argument("--out", default="bench_results/attention")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.one:
        record = measure_one(args.one, lengths[0], args.heads, args.head_dim, args.repeats, args.window, args.threads)
        print(json.dumps(record))
        return
    methods = args.methods.split(",")
    for m in methods:
        if m not in METHODS:
            p.error(f"--methods: unknown method {m!r}; choose from {METHODS}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for T in lengths:
        for m in methods:
            if (m in EXACT and T > args.max_exact_len) or (m == "alibi_dense_sdpa" and T > args.max_dense_len):
                records.append({"method": m, "T": T, "skipped": "skipped (O(T^2))"})
                continue
            r = _run_subprocess(m, T, args)
            records.append(r)
            shown = f"{r['median_s']:.3f} s, {r['peak_mem_mib']:.0f} MiB" if "median_s" in r else r
            print(f"T={T:6d} {m:18s} {shown}", flush=True)
    (out / "results.json").write_text(json.dumps(records, indent=1))
    table = markdown_table(records)
    lines = summary(records)
    (out / "table.md").write_text(table + "\n\n" + "\n".join(f"- {s}" for s in lines) + "\n")
    plot(records, out / "attention_time.png")
    print(table)
    print("\n".join(lines))
    print(f"wrote {out}/results.json, table.md, attention_time.png")


if __name__ == "__main__":
    main()
