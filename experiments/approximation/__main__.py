"""Approximation error of positional LSH versus the number of samples.

    python -m experiments.approximation --sigma 4,16,64 --seq-len 1024 \
        --samples 1,2,4,...,1024 --seeds 5 --sampler iid,stratified --out runs/approx \
        [--truncated] [--checkpoint DIR]

--truncated adds exact ALiBi truncated at the window of each s's cost,
w = ceil((ln s + 0.58) sigma), beside the samplers.

Writes results.json, table.md and PNG plots to --out; prints a summary. Run from the
repository root (``-m`` puts it on ``sys.path``); importing ``experiments`` registers the
lab's samplers, so ``--sampler`` takes their names too.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sigma", default="4,16,64", help="comma-separated kernel scales (ALiBi slope 1/sigma)")
    p.add_argument("--seq-len", type=int, default=1024, help="positions n (and tokens for the output error)")
    p.add_argument("--samples", default="1,2,4,...,1024", help="increasing s; '...' continues the ratio")
    p.add_argument("--seeds", type=int, default=5, help="hashes per point for the mask error")
    p.add_argument("--output-seeds", type=int, default=2, help="hashes per point for the output error")
    p.add_argument("--sampler", default="iid,stratified",
                   help="comma-separated samplers: iid, stratified, stratified_ramp, stratified_ramp_alt")
    p.add_argument("--truncated", action="store_true",
                   help="also exact ALiBi truncated at w = ceil((ln s + 0.58) sigma), the one-pass band of s samples")
    p.add_argument("--block-seq-lens", default="256,1024,4096,16384", help="n values for the largest-block curve")
    p.add_argument("--checkpoint", default=None, help="Hugging Face model dir: capture q/k/v from its layers")
    p.add_argument("--layers", default=None, help="checkpoint layers to capture (default first,middle,last)")
    p.add_argument("--text", default=None,
                   help="text fed to the checkpoint: a text file or a corpus .jsonl (default: a stdlib source file)")
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args(argv)

    from tqdm import tqdm

    from experiments.approximation.approx_report import (ApproxErrorConfig, num_steps, parse_int_list, run_study,
                                                         save, summary_lines)

    cfg = ApproxErrorConfig(
        sigma=[float(x) for x in args.sigma.split(",") if x.strip()],
        seq_len=args.seq_len,
        samples=parse_int_list(args.samples),
        seeds=args.seeds,
        samplers=[x.strip() for x in args.sampler.split(",") if x.strip()],
        truncated=args.truncated,
        output_seeds=args.output_seeds,
        block_seq_lens=parse_int_list(args.block_seq_lens),
        checkpoint=args.checkpoint,
        layers=parse_int_list(args.layers) if args.layers else None,
    )
    print(f"approx_error: {cfg}")
    if cfg.checkpoint:
        from experiments.approximation.qkv_capture import checkpoint_qkv

        extra = checkpoint_qkv(cfg.checkpoint, cfg.seq_len, cfg.layers, args.text)
    else:
        extra = []
    steps = num_steps(cfg, len(extra))
    start = time.time()
    with tqdm(total=steps, desc="approx_error") as bar:
        def progress(msg: str) -> None:
            bar.set_postfix_str(msg)
            bar.update(1)
        results = run_study(cfg, extra, progress)
    paths = save(results, Path(args.out))
    print(f"done in {time.time() - start:.0f}s; wrote " + ", ".join(str(x) for x in paths))
    for line in summary_lines(results):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
