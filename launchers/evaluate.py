"""Length extrapolation of a checkpoint under several attention modes.

    python launchers/evaluate.py --checkpoint runs/quickstart --lengths 256,512,1024 \
        --modes plsh:s=4,plsh:s=16,alibi,fixed,window:128,none --out runs/quickstart/extrapolation

    # lengths that do not fit one process: sequence parallelism over all ranks
    torchrun --nproc_per_node 4 launchers/evaluate.py --checkpoint ... --lengths 65536 ...

Writes results.json, results.md, ppl_vs_length.png and tensorboard/ under --out.
Scoring (default, the paper's protocol): the last K tokens of overlapping
windows (--last-tokens, default half the shortest length), the windows of
every length aligned to end at the same tokens, so every cell scores the same
target tokens (--no-align: windows start at multiples of K instead); each cell
has a confidence interval over windows (--ci se|bootstrap, --ci-level) and,
with --reference MODE, the paired perplexity ratio of every mode to MODE.
Modes: see --modes below (plsh_dist/eval/mode_specs.py). --data: omit for the
checkpoint's own validation split, else files/globs (comma-separated) or a
datasets name (owner/name[:config], --split).
"""

from __future__ import annotations

import argparse
import os
import sys


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} needs integers >= 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    from plsh_dist.eval.mode_specs import spec_usage

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="run dir, its final/ export, or checkpoints/step_XXXXXXXX")
    p.add_argument("--data", default=None, help="files/globs or a datasets name; default: the checkpoint's val split")
    p.add_argument("--split", default="val", help="split of a datasets name (or of the checkpoint's data)")
    p.add_argument("--lengths", required=True, help="context lengths, e.g. 2048,4096,8192")
    p.add_argument("--modes", default="plsh:s=8,plsh:s=32,alibi,fixed,window:512,none",
                   help=f"comma-separated attention modes: {spec_usage()} (default: %(default)s)")
    p.add_argument("--seeds", default="0,1,2", help="hash seeds of PLSH modes (mean and std over them)")
    p.add_argument("--scoring", default="last", help="last (default), whole or whole,last")
    p.add_argument("--last-tokens", type=int, default=None,
                   help="K of 'last' scoring (the paper: 8192; default: half the shortest length)")
    p.add_argument("--no-align", action="store_true",
                   help="'last' windows start at multiples of K (a longer length then scores later text)")
    p.add_argument("--ci", default="se", choices=("se", "bootstrap"),
                   help="confidence interval over windows: t x standard error (se) or percentile bootstrap")
    p.add_argument("--ci-level", type=float, default=0.95, help="confidence level of the interval")
    p.add_argument("--bootstrap-resamples", type=int, default=2000)
    p.add_argument("--reference", default=None,
                   help="mode to pair every other mode with (perplexity ratio over the same windows), e.g. alibi")
    p.add_argument("--max-windows", type=int, default=16, help="windows per length (0 = all the data fills)")
    p.add_argument("--document-masking", action="store_true",
                   help="attend within documents only (each ends with EOS); off by default, comparable with "
                        "earlier results and the paper's protocol")
    p.add_argument("--tokenizer", default=None, help="tokenizer .model (default: the checkpoint's own)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--sampler-module", default=None,
                   help="module to import first: it registers a sampler that --modes names and the "
                        "checkpoint's [attention].sampler_module does not (e.g. experiments.samplers)")
    args = p.parse_args(argv)

    import torch.distributed as dist

    from plsh_dist.eval.extrapolation import EvalSettings, evaluate_checkpoint, format_table
    from plsh_dist.hashing import import_sampler_module
    from plsh_dist.writable import check_writable_dir

    try:
        if args.sampler_module is not None:
            import_sampler_module(args.sampler_module, "--sampler-module")
        check_writable_dir(args.out, "--out")  # before the evaluation: its results must have somewhere to go
        lengths = _ints(args.lengths, "--lengths")
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        scorings = [s.strip() for s in args.scoring.split(",") if s.strip()]
        last_tokens = args.last_tokens
        if "last" in scorings and last_tokens is None:
            last_tokens = max(1, min(lengths) // 2)
        sp_group = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.init_process_group(backend="gloo")  # evaluation runs on CPU tensors; gloo serves any device
            sp_group = dist.group.WORLD
        settings = EvalSettings(lengths=lengths, modes=args.modes, seeds=seeds, scorings=scorings,
                                last_tokens=last_tokens, max_windows=args.max_windows or None,
                                align=not args.no_align, ci=args.ci, ci_level=args.ci_level,
                                bootstrap_resamples=args.bootstrap_resamples, reference=args.reference,
                                document_masking=args.document_masking, data=args.data, split=args.split,
                                progress=not args.no_progress)
        results = evaluate_checkpoint(args.checkpoint, settings, args.out, tokenizer=args.tokenizer,
                                      sp_group=sp_group)
    except ValueError as exc:
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return 2
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(format_table(results))
        print(f"wrote {args.out}/results.json, results.md, ppl_vs_length.png, tensorboard/ ({results['wall_s']} s)")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
