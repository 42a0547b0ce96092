"""FlexAttention against this package's CPU paths: forward only, one thread, side by side.

    python experiments/flex_cpu.py --out results/flex

For each length T, three biases, each computed by this package's CPU path and
by PyTorch's compiled FlexAttention (:mod:`plsh_dist.ops.flex.attend`) on the same
q, k, v (batch 1, fp32, causal, per-head sigma = 1 / ALiBi slope), under
``torch.no_grad()`` (FlexAttention compiles no CPU backward):

- ``alibi``: exact ALiBi; ours ``alibi_attention`` (query chunks), Flex the ALiBi
  ``score_mod`` over the causal block mask;
- ``truncated``: ALiBi inside ``w_h = ceil((ln s + 0.58) sigma_h)`` (s samples'
  one-pass cost); ours ``alibi_attention(window=w)``, Flex a per-head window band;
- ``plsh``: PLSH one pass at s samples; ours ``plsh_attention`` (the table's CPU
  choice, the chunked one pass), Flex ``backend="flex"`` (the count from block
  bounds), and ``plsh_hash`` the count straight from the hash's pitch and shift
  tables (the GPU benchmark's form).

Time: median of ``--repeats`` calls after one warm-up (for Flex the warm-up
compiles; its time is reported apart, and a compile the on-disk inductor cache
serves is fast); the methods of a bias take turns within each repeat, so a
shared machine's load falls on them alike. Each Flex output is compared with
ours (max abs difference).
Writes ``results.json`` and ``README.md``-ready ``table.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a clone without installing

import torch  # noqa: E402

from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: E402
from plsh_dist.ops import alibi_attention, plsh_attention  # noqa: E402
from plsh_dist.ops.alibi import equal_cost_c, truncation_windows  # noqa: E402
from plsh_dist.ops.flex.attend import (  # noqa: E402
    alibi_band, alibi_score_mod, band_block_mask, flex_attend, hash_count_score_mod,
)
from plsh_dist.ops.flex.strategy import block_bound_tables  # noqa: E402


def plsh_hash_flex(q, k, v, lsh: PositionalLSH) -> torch.Tensor:
    """PLSH on FlexAttention with the count from the pitch and shift tables (causal, positions 0..T-1)."""
    T = q.shape[1]
    first, _ = block_bound_tables(lsh, torch.arange(T), causal=True)
    start = first.min(dim=0).values
    end = torch.arange(1, T + 1, dtype=torch.int32)[None].expand_as(start).contiguous()
    return flex_attend(q, k, v, hash_count_score_mod(lsh.pitch, lsh.shift, torch.arange(T)),
                       band_block_mask(start, end))


def cases(H: int, s: int, T: int):
    """(bias, ours, flex methods {name: fn}) with fn(q, k, v) -> out (B, T, H, D)."""
    slopes = alibi_slopes(H)
    sigma = slopes.double().reciprocal()
    window = truncation_windows(equal_cost_c(s), sigma)
    exact_mask = band_block_mask(*alibi_band(T, None, True, "cpu"))
    window_mask = band_block_mask(*alibi_band(T, window, True, "cpu"))
    lsh = PositionalLSH(sigma, s, seed=0)
    return [
        ("alibi", lambda q, k, v: alibi_attention(q, k, v, slopes=slopes),
         {"flex": lambda q, k, v: flex_attend(q, k, v, alibi_score_mod(slopes), exact_mask)}),
        (f"truncated_s{s}", lambda q, k, v: alibi_attention(q, k, v, slopes=slopes, window=window),
         {"flex": lambda q, k, v: flex_attend(q, k, v, alibi_score_mod(slopes), window_mask)}),
        (f"plsh_s{s}", lambda q, k, v: plsh_attention(q, k, v, sigma=sigma, num_samples=s, seed=0),
         {"flex": lambda q, k, v: plsh_attention(q, k, v, sigma=sigma, num_samples=s, seed=0, backend="flex"),
          "flex_hash": lambda q, k, v: plsh_hash_flex(q, k, v, lsh)}),
    ]


def timed(fns: dict, q, k, v, repeats: int) -> dict:
    """``{name: (out, first call's seconds, seconds of each repeat)}``. The methods take turns
    within each repeat, so a machine's changing load falls on all of them alike."""
    result = {}
    for name, fn in fns.items():  # the first call: Flex compiles here
        t0 = time.perf_counter()
        out = fn(q, k, v)
        result[name] = (out, time.perf_counter() - t0, [])
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(q, k, v)
            result[name][2].append(time.perf_counter() - t0)
    return result


def run(args) -> list[dict]:
    torch.set_num_threads(args.threads)
    records = []
    for T in args.lengths:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, T, args.heads, args.head_dim, generator=g) for _ in range(3))
        with torch.no_grad():
            for bias, ours, flex in cases(args.heads, args.samples, T):
                runs = timed({"ours": ours, **flex}, q, k, v, args.repeats)
                ref, first, times = runs.pop("ours")
                ours_median = statistics.median(times)
                records.append({"T": T, "bias": bias, "method": "ours", "first_s": first, "times_s": times,
                                "median_s": ours_median})
                print(f"T={T:>6} {bias:<14} ours      {ours_median:8.3f} s", flush=True)
                for name, (out, first, times) in runs.items():
                    median = statistics.median(times)
                    rec = {"T": T, "bias": bias, "method": name, "first_s": first, "times_s": times,
                           "median_s": median, "speedup_vs_ours": ours_median / median,
                           "max_abs_diff_vs_ours": float((out.double() - ref.double()).abs().max())}
                    records.append(rec)
                    print(f"T={T:>6} {bias:<14} {name:<9} {rec['median_s']:8.3f} s  x{rec['speedup_vs_ours']:.2f} "
                          f"(first call {first:.1f} s, max |diff| {rec['max_abs_diff_vs_ours']:.1e})", flush=True)
    return records


def table(records: list[dict]) -> str:
    ours = {(r["T"], r["bias"]): r["median_s"] for r in records if r["method"] == "ours"}
    lines = ["| T | bias | ours (s) | FlexAttention (s) | ours / Flex | Flex's first call (s) | max abs diff |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        if r["method"] == "ours":
            continue
        name = r["bias"] + ("" if r["method"] == "flex" else f" ({r['method']})")
        lines.append(f"| {r['T']:,} | {name} | {ours[(r['T'], r['bias'])]:.3f} | {r['median_s']:.3f} | "
                     f"{r['speedup_vs_ours']:.2f}x | {r['first_s']:.1f} | {r['max_abs_diff_vs_ours']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=lambda x: [int(t) for t in x.split(",")], default=[4096, 16384])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--samples", type=int, default=8, help="s of PLSH, and of truncated ALiBi's equal cost")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = run(args)
    meta = {"command": "python experiments/flex_cpu.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
            "torch": torch.__version__, "threads": args.threads, "heads": args.heads, "head_dim": args.head_dim,
            "samples": args.samples, "repeats": args.repeats, "load_average_after": os.getloadavg()}
    (out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    (out / "table.md").write_text(table(records))
    print(table(records))
    return 0 if all(math.isfinite(r["median_s"]) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
