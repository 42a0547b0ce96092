"""How many fewer samples does a sampler need than i.i.d. for the same max-norm error?

    python experiments/sampler_ratio.py --sigma 4,16,64 --seq-len 1024 --seeds 20 \
        --sampler stratified,stratified_ramp --samples 8,10,...,32 --out results/sampler

For each sigma: the i.i.d. estimator's mean max-norm error ``||L* - M~||_max``
at ``s = match_at`` (64: the design target) over ``seeds`` hashes, then each
sampler's mean error over a ladder of ``s``; the ``s`` at which a sampler's
curve first reaches the i.i.d. level (log-log interpolation,
:func:`experiments.approximation.approx_error.samples_to_match`) gives the ratio
``match_at / s``. The command writes ratios.json and ratios.md to ``--out`` and
prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing
import experiments  # noqa: E402,F401  registers the lab's samplers when this file runs as a script

from experiments.approximation.approx_error import mask_error, samples_to_match  # noqa: E402

__all__ = ["sampler_ratios", "format_ratios"]


def sampler_ratios(sigmas: Sequence[float], n: int, samplers: Sequence[str], ladder: Sequence[int],
                   seeds: int, match_at: int = 64) -> dict:
    """``{"rows": [{sigma, iid_level, <sampler>_s, <sampler>_ratio, <sampler>_curve}], ...}``."""
    rows = []
    t0 = time.time()
    for sigma in sigmas:
        level = mask_error(sigma, n, [match_at], seeds, "iid", spectral=False)[0]["max_mean"]
        row = {"sigma": float(sigma), "iid_s": match_at, "iid_level": level}
        for sampler in samplers:
            curve = mask_error(sigma, n, ladder, seeds, sampler, spectral=False)
            s_star = samples_to_match(curve, level)
            row[f"{sampler}_s"] = s_star
            row[f"{sampler}_ratio"] = match_at / s_star if s_star else None
            row[f"{sampler}_curve"] = [{"s": r["s"], "max_mean": r["max_mean"], "max_std": r["max_std"]} for r in curve]
        rows.append(row)
    return {"n": n, "seeds": seeds, "match_at": match_at, "ladder": list(ladder), "samplers": list(samplers),
            "rows": rows, "wall_s": round(time.time() - t0, 1)}


def format_ratios(res: dict) -> str:
    """Markdown: per sigma, the i.i.d. level and each sampler's s and ratio."""
    samplers = res["samplers"]
    out = [f"max-norm error of M~ at n = {res['n']}, mean over {res['seeds']} seeds; "
           f"s needed to reach i.i.d.'s error at s = {res['match_at']} (ratio = {res['match_at']} / s)\n",
           "| sigma | iid max error at s = %d | " % res["match_at"] + " | ".join(samplers) + " |",
           "|---|---|" + "---|" * len(samplers)]
    for r in res["rows"]:
        cells = []
        for name in samplers:
            s = r[f"{name}_s"]
            cells.append(f"{s:.1f} ({r[f'{name}_ratio']:.2f}x fewer)" if s else "not reached")
        out.append(f"| {r['sigma']:g} | {r['iid_level']:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sigma", default="4,16,64")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--sampler", default="stratified,stratified_ramp")
    p.add_argument("--samples", default="8,10,12,14,16,18,20,22,24,28,32", help="ladder of s for the samplers")
    p.add_argument("--match-at", type=int, default=64, help="the i.i.d. s whose error is to be matched")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    res = sampler_ratios([float(x) for x in args.sigma.split(",")], args.seq_len,
                         [x.strip() for x in args.sampler.split(",") if x.strip()],
                         [int(x) for x in args.samples.split(",")], args.seeds, args.match_at)
    res["command"] = "python experiments/sampler_ratio.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ratios.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "ratios.md").write_text(format_ratios(res))
    print(format_ratios(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
