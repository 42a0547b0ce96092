"""Plan a run before launching it: per-rank memory, FLOPs per step, SP halo traffic, and whether it fits.

    python launchers/plan.py --config configs/qwen3_0.6b_32k_plsh_sp4.toml [--gpu-memory-gib 80] \
        [--seq-len 32k] [--sp-size 4] [--world-size 8] [--device cuda|cpu] [--per-layer] [--section.key=value ...]
    python launchers/plan.py --config configs/qwen3_0.6b_*.toml --seq-len 8k,32k,128k,1M --table
    python launchers/plan.py --config configs/debug.toml --device cpu --world-size 1 --measure
    python launchers/plan.py --config configs/debug.toml --device cpu --world-size 2 [--cpu-memory-gib 64] [--nodes 1]

Several configs or lengths print one markdown table row each (``--table``
forces the table for one). ``--measure`` (CPU, one process) also runs two
real training steps of the config and prints the measured peak next to the
estimate (the data is prepared first, outside the measurement; the steps run
in a temporary directory, removed after: the config's out_dir is never moved
aside, resumed or written).
On CPU (``--device cpu``) the ranks of a machine share its memory: the plan
counts on this machine's available memory (``MemAvailable``, or
``--cpu-memory-gib``) divided by the ranks on it (``--world-size`` /
``--nodes``), and says so.
Estimating logic: ``plsh_dist.plan``. Exit code 2 for a bad flag (the flag and
a valid value named), or a config or layout the trainer would refuse, with the
trainer's own message.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def _tokens(text: str) -> int:
    """``32768``, ``32k`` or ``1M`` (k = 1024, M = 1024^2), at least one token."""
    text = text.strip()
    scale = {"k": 2**10, "K": 2**10, "m": 2**20, "M": 2**20}.get(text[-1:], 1)
    try:
        tokens = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count; write e.g. 32768, 32k or 1M") from None
    if tokens < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a sequence length is at least 1 token; e.g. --seq-len 32k")
    return tokens


def _lengths(text: str) -> list[int]:
    """``--seq-len``: a comma list of ``_tokens``."""
    items = [x for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r} names no length; e.g. --seq-len 32k or --seq-len 8k,32k")
    return [_tokens(x) for x in items]


def _count(example: str):
    """An argparse type: a whole number >= 1 (``example``: a valid use of the flag)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; e.g. {example}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{value} is not >= 1; e.g. {example}")
        return value
    return parse


def _gib(example: str):
    """An argparse type: a finite number of GiB > 0."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB; e.g. {example}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r} is not a memory size > 0; e.g. {example}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Any --section.key=value overrides the config file.")
    ap.add_argument("--config", nargs="+", required=True, help="TOML run config(s)")
    ap.add_argument("--gpu-memory-gib", type=_gib("--gpu-memory-gib 80"), default=None,
                    help="memory per GPU in GiB = 2^30 bytes (default 80; an 80 GB H100 has 79.6 GiB usable)")
    ap.add_argument("--gpu-memory-gb", type=_gib("--gpu-memory-gib 80"), default=None,
                    help=argparse.SUPPRESS)  # the old name
    ap.add_argument("--cpu-memory-gib", type=_gib("--cpu-memory-gib 64"), default=None,
                    help="--device cpu: memory of one machine in GiB, shared by its ranks "
                         "(default: this machine's MemAvailable)")
    ap.add_argument("--seq-len", type=_lengths, default=None,
                    help="comma list of lengths, e.g. 8k,32k (default: the config's)")
    ap.add_argument("--sp-size", type=_count("--sp-size 4"), default=None, help="override [parallel].sp_size")
    ap.add_argument("--world-size", type=_count("--world-size 8"), default=8,
                    help="ranks of the job (default 8: one 8-GPU node)")
    ap.add_argument("--nodes", type=_count("--nodes 2"), default=1,
                    help="--device cpu: machines the ranks are spread over (default 1: all on one)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="plan for GPUs (bf16) or CPU (fp32)")
    ap.add_argument("--per-layer", action="store_true", help="print the halo traffic of every layer")
    ap.add_argument("--table", action="store_true", help="one markdown row per config and length")
    ap.add_argument("--measure", action="store_true", help="CPU: also measure two real steps' peak")
    args, overrides = ap.parse_known_args(argv)

    from plsh_dist.config import load_config
    from plsh_dist.plan import plan_run
    from plsh_dist.plan.advice import advise
    from plsh_dist.plan.report import format_plan, table_header, table_row

    lengths = args.seq_len or [None]
    extra = list(overrides) + ([f"--parallel.sp_size={args.sp_size}"] if args.sp_size is not None else [])
    if args.device == "cpu":
        extra.append("--run.device=cpu")
    if args.gpu_memory_gb is not None:
        if args.gpu_memory_gib is not None:
            ap.error("give --gpu-memory-gib only (--gpu-memory-gb is its old name)")
        print(f"note: --gpu-memory-gb is now --gpu-memory-gib; {args.gpu_memory_gb:g} is read as GiB (2^30 bytes), "
              "as before", file=sys.stderr)
        args.gpu_memory_gib = args.gpu_memory_gb
    device_bytes = _rank_budget(ap, args)
    table = args.table or len(args.config) > 1 or len(lengths) > 1
    if table:
        print("\n".join(table_header()))
    for path in args.config:
        for length in lengths:
            try:
                cfg = load_config(path, extra + ([f"--data.seq_len={length}"] if length is not None else []))
                plan = plan_run(cfg, world_size=args.world_size, device=args.device)
            except ValueError as exc:
                print(f"config error ({path}{f', seq_len {length}' if length else ''}): {exc}", file=sys.stderr)
                return 2
            advice = advise(cfg, plan, device_bytes, world_size=args.world_size)
            if table:
                print(table_row(plan, device_bytes, advice, Path(path).stem))
                continue
            print(format_plan(plan, device_bytes, advice, per_layer=args.per_layer))
            if args.measure:
                print(_measured(cfg, plan))
    return 0


def _rank_budget(ap: argparse.ArgumentParser, args) -> int:
    """Bytes one rank may use: a GPU's memory, or on CPU its share of the machine's (printed)."""
    if args.device == "cuda":
        if args.cpu_memory_gib is not None or args.nodes != 1:
            ap.error("--cpu-memory-gib and --nodes are for --device cpu; on GPUs give --gpu-memory-gib "
                     "(memory per GPU)")
        return int((80.0 if args.gpu_memory_gib is None else args.gpu_memory_gib) * 2**30)
    if args.gpu_memory_gib is not None:
        ap.error("--gpu-memory-gib is the memory of one GPU; with --device cpu the ranks of a machine share its "
                 "memory: give --cpu-memory-gib (one machine's), or leave it out for this machine's")
    if args.world_size % args.nodes:
        ap.error(f"--nodes {args.nodes} does not divide --world-size {args.world_size}; give a world size that is "
                 f"a multiple of the nodes, e.g. --world-size {args.nodes * max(1, args.world_size // args.nodes)}")
    from plsh_dist.plan.machine import machine_memory, per_rank_budget
    from plsh_dist.plan.report import gib

    ranks = args.world_size // args.nodes
    if args.cpu_memory_gib is not None:
        machine, source = int(args.cpu_memory_gib * 2**30), "--cpu-memory-gib"
    else:
        mem = machine_memory()
        machine, source = mem.available, f"{mem.source}; {gib(mem.total)} in all"
    budget = per_rank_budget(machine, ranks)
    print(f"CPU memory: {gib(machine)} per machine ({source}), shared by its {ranks} rank(s): "
          f"{gib(budget)} per rank")
    return budget


def _measured(cfg, plan) -> str:
    if plan.device != "cpu" or plan.world != 1:
        return "--measure runs one CPU process: add --device cpu --world-size 1"
    from plsh_dist.data import prepare_data
    from plsh_dist.train.peak_measure import measure_cpu_peak

    prepare_data(cfg.data, cfg.tokenizer)  # tokenizer and token caches: before, not in, the measured window
    est = plan.memory.peak
    measured, note = measure_cpu_peak(cfg), ""
    if measured > _SPURIOUS * est:
        # Seen now and then on a loaded machine, in no particular call: a peak one DeepSpeed gradient
        # bucket above every other measurement of the same config. A second measurement tells it from an
        # underestimate (which both would show); the lower is kept, and the first is named.
        first = measured
        measured = min(first, measure_cpu_peak(cfg))
        note = f" (lower of two measurements; the first gave {first / 2**30:.3f} GiB)"
    return (f"measured peak (two real steps, live torch CPU bytes, in a scratch directory): "
            f"{measured / 2**30:.3f} GiB; estimate {est / 2**30:.3f} GiB ({est / measured - 1:+.1%}){note}")


#: A measurement above this many times the estimate is repeated (``_measured``).
_SPURIOUS = 1.25


if __name__ == "__main__":
    sys.exit(main())
