"""The 0.6B rehearsal across two hosts on this machine (network namespaces; root, sshd, pdsh).

    make rehearsal                                      # the real one: configs/qwen3_0.6b_8k_plsh_s10.toml, 4k tokens
    python tools/rehearsal.py --seq-len 8192        # 4k-8k tokens; hours on a 2-core CPU
    python tools/rehearsal.py --tiny --out DIR      # the same phases, configs/debug.toml at 256 tokens (minutes)

From the repository root with it on ``PYTHONPATH`` (as ``make`` sets it): the hosts live in
``tools/cluster/``, beside the package, not in it.

Two hosts, node-0 and node-1 (``tools/cluster/hosts.py``), one rank each, SP = 2
across them, ZeRO-3, activation checkpointing, the chunked loss: an
uninterrupted run, the same run with a checkpoint and a SIGKILL of node-1's
rank inside the last step, its resume (losses equal bit for bit), the export
gathered from ZeRO-3 (from_pretrained logits equal the checkpoint's), an
evaluation at twice the training length, and the planner beside the measured
peak and step times (``tools/cluster/rehearsal.py`` says what each phase checks).
Writes ``OUT/rehearsal.json`` and the page (``--page``; default
``results/cluster/rehearsal.md``, with ``--tiny`` ``OUT/rehearsal.md``).

Exit codes: 0 every phase ran and every check passed; 1 a check failed or a
phase failed or ran past its bound (the page says which; what ran is kept);
2 refused before any work: the hosts cannot be made here (not root, a tool
missing: ``make cluster-deps``), a bad flag or config, too little memory for
the planner's peak or disk for the checkpoints, an out directory that is not
empty.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; e.g. 4096") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    from tools.cluster.rehearsal import REAL_CONFIG, TINY_CONFIG, Refused, Settings, rehearse
    from tools.cluster.rehearsal_page import write_record

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true",
                   help=f"the stand-in: {TINY_CONFIG.name}'s model at 256 tokens, short bounds (minutes)")
    p.add_argument("--config", type=Path, default=None, help=f"run config (default {REAL_CONFIG.name})")
    p.add_argument("--seq-len", type=_positive(int), default=None, help="training length (default 4096; tiny 256)")
    p.add_argument("--steps", type=_positive(int), default=3, help="optimizer steps, at least 2 (default 3)")
    p.add_argument("--out", type=Path, default=None,
                   help="new or empty directory for the runs (default runs/rehearsal, tiny runs/rehearsal_tiny)")
    p.add_argument("--page", type=Path, default=None, help="the markdown page to write")
    p.add_argument("--step-timeout-s", type=_positive(float), default=None,
                   help="bound of one optimizer step (default 1800; tiny 120)")
    p.add_argument("--startup-timeout-s", type=_positive(float), default=None,
                   help="bound of a phase's start-up, checkpoint, export and validation (default 900; tiny 300)")
    p.add_argument("--prepare-timeout-s", type=_positive(float), default=None,
                   help="bound of the data preparation, the tokenizer's training included (default 3600; tiny 300)")
    p.add_argument("--eval-windows", type=_positive(int), default=2, help="evaluation windows per length (default 2)")
    args = p.parse_args(argv)

    root = Path(__file__).resolve().parents[1]
    out = args.out or root / "runs" / ("rehearsal_tiny" if args.tiny else "rehearsal")
    settings = Settings(
        config=(args.config or (TINY_CONFIG if args.tiny else REAL_CONFIG)).resolve(),
        seq_len=args.seq_len or (256 if args.tiny else 4096), out=out.resolve(), steps=args.steps,
        prepare_timeout_s=args.prepare_timeout_s or (300.0 if args.tiny else 3600.0),
        startup_timeout_s=args.startup_timeout_s or (300.0 if args.tiny else 900.0),
        step_timeout_s=args.step_timeout_s or (120.0 if args.tiny else 1800.0),
        collective_timeout_s=60 if args.tiny else 600, eval_windows=args.eval_windows, tiny=args.tiny)
    page = args.page or (settings.out / "rehearsal.md" if args.tiny else root / "results" / "cluster" / "rehearsal.md")
    command = shlex.join(["python", "tools/rehearsal.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        record = rehearse(settings, command)
    except Refused as exc:
        print(f"rehearsal refused: {exc}", file=sys.stderr)
        return 2
    write_record(record.report, settings.out / "rehearsal.json", page, root)
    for phase in record.report["phases"]:
        print(f"{phase['name']:>14}: {phase['wall_s']:8.1f} s  {'ok' if phase['ok'] else 'FAILED'}  {phase['detail']}")
    failed = [c["name"] for c in record.report["checks"] if not c["ok"]]
    if record.report.get("stopped"):
        print(f"stopped: {record.report['stopped']}", file=sys.stderr)
    if failed:
        print("failed checks: " + "; ".join(failed), file=sys.stderr)
    print(f"wrote {settings.out / 'rehearsal.json'} and {page}: {'passed' if record.report['ok'] else 'FAILED'}")
    return 0 if record.report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
