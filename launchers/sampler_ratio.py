"""Samples a sampler needs to match i.i.d. PLSH's max-norm error at s = 64, per sigma.

    python launchers/sampler_ratio.py --sigma 4,16,64 --seq-len 1024 --seeds 20 \
        --sampler stratified,stratified_ramp --samples 8,10,...,32 --out results/sampler

Writes ratios.json and ratios.md to --out; prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing


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

    from plsh_dist.eval.sampler_ratio import format_ratios, sampler_ratios

    torch.set_num_threads(1)
    res = sampler_ratios([float(x) for x in args.sigma.split(",")], args.seq_len,
                         [x.strip() for x in args.sampler.split(",") if x.strip()],
                         [int(x) for x in args.samples.split(",")], args.seeds, args.match_at)
    res["command"] = "python launchers/sampler_ratio.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ratios.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "ratios.md").write_text(format_ratios(res))
    print(format_ratios(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
