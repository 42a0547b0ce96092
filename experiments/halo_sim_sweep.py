"""Halo traffic at scale: PLSH's SP halo from the real hash vs ring attention and Ulysses, and host planning time.

    python experiments/halo_sim_sweep.py --seq-len 128k,1M,4M --sp 8,64,256 --samples 8,100 --sigma per-head,256 \
        --out results/halo_sim [--repeats 3] [--no-timing] [--from-json results/halo_sim/halo_sim.json]

For every (T, P, sigma, s): the forward bytes each rank receives per layer
(mean over ranks and layers, and the worst rank of the worst layer) from the
hash each of the 28 layers of Qwen3-0.6B draws at step 0, next to ring
attention's and Ulysses' bytes per rank for the same shapes (formulas in
``experiments/halo_sim.py``), and the host planning time per forward of
the last rank (CPU time of one thread, median of ``--repeats``). Writes
``halo_sim.json``, ``halo_sim.md`` and ``halo_sim.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing


def _tokens(text: str) -> int:
    """``131072``, ``128k`` or ``4M`` (k = 1024, M = 1024^2)."""
    text = text.strip()
    scale = {"k": 2**10, "K": 2**10, "m": 2**20, "M": 2**20}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def _sigma(text: str) -> float | None:
    return None if text.strip() in ("per-head", "none", "None") else float(text)


def _name(tokens: int) -> str:
    for unit, scale in (("M", 2**20), ("k", 2**10)):
        if tokens % scale == 0:
            return f"{tokens // scale}{unit}"
    return str(tokens)


def _bytes(x: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}" if x / scale < 100 else f"{x / scale:.0f} {unit}"
    return f"{x:.0f} B"


def _variant(sigma: float | None, s: int) -> str:
    return f"{'per-head σ' if sigma is None else f'σ = {sigma:g}'}, s = {s}"


def run(args) -> dict:
    import torch

    torch.set_num_threads(1)
    from experiments.halo_sim import QWEN3_0_6B, planning_time, ring_bytes, simulate_halo, ulysses_bytes

    shape = QWEN3_0_6B
    records = []
    for T in args.seq_len:
        for P in args.sp:
            ring, uly = ring_bytes(T, P, shape), ulysses_bytes(T, P, shape)
            row = {"seq_len": T, "sp": P, "tokens_per_rank": T // P,
                   "ring": {"forward": ring.forward, "backward": ring.backward},
                   "ulysses": {"forward": uly.forward, "backward": uly.backward, "feasible": uly.feasible},
                   "plsh": []}
            for sigma in args.sigma:
                for s in args.samples:
                    sim = simulate_halo(T, P, sigma, s, shape, run_seed=args.run_seed)
                    cell = {"sigma": "per-head" if sigma is None else sigma, "num_samples": s,
                            "forward_mean": sim.forward_mean, "forward_max": sim.forward_max,
                            "backward_mean": sim.forward_mean, "backward_max": sim.forward_max,
                            "per_forward_worst_rank_sum": sim.per_forward_max,
                            "max_peers": max(x.max_peers for x in sim.layers),
                            "slots_max": max(x.slots_max for x in sim.layers),
                            "per_layer_max": [x.bytes_max for x in sim.layers],
                            "simulation_s": sim.seconds}
                    if not args.no_timing:
                        pt = planning_time(T, P, sigma, s, shape, repeats=args.repeats, run_seed=args.run_seed,
                                           varlen_max_elements=args.varlen_max_elements)
                        cell.update(halo_plan_s=pt.halo, varlen_plan_s=pt.varlen,
                                    varlen_buckets_s=pt.varlen_buckets,
                                    varlen_measured_at_tokens=pt.varlen_extrapolated_from)
                    row["plsh"].append(cell)
                    print(f"T={_name(T)} P={P} {_variant(sigma, s)}: halo fwd mean {_bytes(sim.forward_mean)}"
                          f" max {_bytes(sim.forward_max)} (ring {_bytes(ring.forward)}, Ulysses "
                          f"{_bytes(uly.forward)}{'' if uly.feasible else ' infeasible'})"
                          + ("" if args.no_timing else
                             f"; planning halo {cell['halo_plan_s'] * 1e3:.1f} ms, varlen "
                             f"{cell['varlen_plan_s'] * 1e3:.0f} ms per forward"), flush=True)
            records.append(row)
    return {"shape": vars(shape), "run_seed": args.run_seed, "repeats": args.repeats, "threads": 1,
            "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
            "varlen_max_elements": args.varlen_max_elements, "records": records}


def markdown(result: dict) -> str:
    recs = result["records"]
    variants = [(c["sigma"], c["num_samples"]) for c in recs[0]["plsh"]]
    label = lambda sg, s: _variant(None if sg == "per-head" else sg, s)  # noqa: E731
    lines = ["Forward bytes one rank receives per layer, one sequence (Qwen3-0.6B: 16 / 8 heads, head_dim 128, "
             "bf16). PLSH: mean over ranks and the 28 layers / worst rank of the worst layer; backward sends "
             "the same bytes back. Ring: (P-1) K/V chunks (backward 2x). Ulysses: all-to-alls of q, k, v, out "
             "(backward 1x); n/a where P does not divide the 16 query heads.", "",
             "| T | P | tokens / rank | " + " | ".join(f"PLSH {label(*v)}" for v in variants)
             + " | ring attention | Ulysses |",
             "|---" * (5 + len(variants)) + "|"]
    for r in recs:
        cells = [f"{_bytes(c['forward_mean'])} / {_bytes(c['forward_max'])}" for c in r["plsh"]]
        uly = _bytes(r["ulysses"]["forward"]) if r["ulysses"]["feasible"] else "n/a"
        lines.append(f"| {_name(r['seq_len'])} | {r['sp']} | {r['tokens_per_rank']:,} | " + " | ".join(cells)
                     + f" | {_bytes(r['ring']['forward'])} | {uly} |")
    if "halo_plan_s" in recs[0]["plsh"][0]:
        lines += ["", "Host planning of the SP halo per forward (28 layers) on the last rank, CPU ms (one thread), "
                  f"median of {result['repeats']}: the hash, plsh_needs (every rank's need), HaloExchange.build "
                  "and the suffix split, as SPBlockAttention.forward calls them (backward reuses the plan).", "",
                  "| T | P | " + " | ".join(label(*v) for v in variants) + " |",
                  "|---" * (2 + len(variants)) + "|"]
        for r in recs:
            lines.append(f"| {_name(r['seq_len'])} | {r['sp']} | "
                         + " | ".join(f"{c['halo_plan_s'] * 1e3:,.0f}" for c in r["plsh"]) + " |")
        lines += ["", "Varlen block plan of the rank's chunk per forward (CUDA per-sample path, varlen_calls; one "
                  "layer timed, x 28), CPU ms, timed on the CPU: total / without the bucket table and block-start "
                  "search (which a GPU computes on the device); ~ = timed on a shorter chunk and scaled linearly.",
                  "", "| T | P | " + " | ".join(label(*v) for v in variants) + " |",
                  "|---" * (2 + len(variants)) + "|"]
        for r in recs:
            cells = []
            for c in r["plsh"]:
                mark = "~" if c["varlen_measured_at_tokens"] else ""
                cells.append(f"{mark}{c['varlen_plan_s'] * 1e3:,.0f} / {mark}"
                             f"{(c['varlen_plan_s'] - c['varlen_buckets_s']) * 1e3:,.0f}")
            lines.append(f"| {_name(r['seq_len'])} | {r['sp']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = result["records"]
    sps = sorted({r["sp"] for r in recs})
    timed = "halo_plan_s" in recs[0]["plsh"][0]
    fig, axes = plt.subplots(2 if timed else 1, len(sps), figsize=(4.2 * len(sps), 7.5 if timed else 4),
                             squeeze=False, sharey="row")
    variants = [(c["sigma"], c["num_samples"]) for c in recs[0]["plsh"]]
    colors = plt.get_cmap("tab10").colors
    for j, P in enumerate(sps):
        rows = sorted((r for r in recs if r["sp"] == P), key=lambda r: r["seq_len"])
        Ts = [r["seq_len"] for r in rows]
        ax = axes[0][j]
        ax.plot(Ts, [r["ring"]["forward"] / 2**20 for r in rows], "k--", marker="s", label="ring attention")
        uly = [(r["seq_len"], r["ulysses"]["forward"] / 2**20) for r in rows if r["ulysses"]["feasible"]]
        if uly:
            ax.plot(*zip(*uly), "k:", marker="^", label="Ulysses")
        for i, (sg, s) in enumerate(variants):
            mean = [r["plsh"][i]["forward_mean"] / 2**20 for r in rows]
            worst = [r["plsh"][i]["forward_max"] / 2**20 for r in rows]
            ax.plot(Ts, mean, marker="o", color=colors[i],
                    label=f"PLSH {_variant(None if sg == 'per-head' else sg, s)}")
            ax.plot(Ts, worst, linestyle="none", marker="_", markersize=12, color=colors[i])
        ax.set(xscale="log", yscale="log", title=f"P = {P}", xlabel="sequence length T")
        ax.set_xticks(Ts, [_name(t) for t in Ts])
        ax.minorticks_off()
        if j == 0:
            ax.set_ylabel("forward MiB received per rank per layer")
            ax.legend(fontsize=7)
        if timed:
            ax = axes[1][j]
            for i, (sg, s) in enumerate(variants):
                ax.plot(Ts, [r["plsh"][i]["halo_plan_s"] * 1e3 for r in rows], marker="o", color=colors[i],
                        label=f"halo plan, {_variant(None if sg == 'per-head' else sg, s)}")
                host = [(r["plsh"][i]["varlen_plan_s"] - r["plsh"][i]["varlen_buckets_s"]) * 1e3 for r in rows]
                ax.plot(Ts, host, marker="x", linestyle="--", color=colors[i],
                        label=f"varlen plan, host part, {_variant(None if sg == 'per-head' else sg, s)}")
            ax.set(xscale="log", yscale="log", xlabel="sequence length T")
            ax.set_xticks(Ts, [_name(t) for t in Ts])
            ax.minorticks_off()
            if j == 0:
                ax.set_ylabel("host planning ms per forward (28 layers)")
                ax.legend(fontsize=6)
    fig.suptitle("PLSH SP halo (markers: worst rank) vs ring attention and Ulysses, Qwen3-0.6B bf16")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", default="128k,1M,4M", help="comma list of lengths (default 128k,1M,4M)")
    ap.add_argument("--sp", default="8,64,256", help="comma list of SP sizes (default 8,64,256)")
    ap.add_argument("--samples", default="8,100", help="comma list of s (default 8,100)")
    ap.add_argument("--sigma", default="per-head,256",
                    help="comma list: per-head and/or constants (default per-head,256)")
    ap.add_argument("--run-seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timing repeats, median reported (default 3)")
    ap.add_argument("--varlen-max-elements", type=int, default=2**27,
                    help="largest (s, H, T/P) bucket table timed directly; above, scaled from a shorter chunk")
    ap.add_argument("--no-timing", action="store_true", help="bytes only")
    ap.add_argument("--out", default="results/halo_sim")
    ap.add_argument("--from-json", default=None, help="rewrite the table and plot of an earlier run's json")
    args = ap.parse_args(argv)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "halo_sim.md").write_text(markdown(result))
        plot(result, out / "halo_sim.png")
        return 0
    args.seq_len = [_tokens(x) for x in args.seq_len.split(",")]
    args.sp = [int(x) for x in args.sp.split(",")]
    args.samples = [int(x) for x in args.samples.split(",")]
    args.sigma = [_sigma(x) for x in args.sigma.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (out / "halo_sim.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "halo_sim.md").write_text(markdown(result))
    plot(result, out / "halo_sim.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
