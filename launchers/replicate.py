"""CPU-scale replication: train the tiny Qwen3 once per attention mode, then
evaluate each at 1x, 1.25x and 2x its train length.

    python launchers/replicate.py --out runs/replication --results results/replication

Every model is trained by ``launchers/pretrain.py`` (the quickstart's code
path) from ``configs/quickstart.toml`` with the same overrides except the
attention mode: identical data order, init seed, step budget and learning
rate schedule. All modes share one constant ``sigma`` (the paper trains with a
constant one), so exact ALiBi uses slope ``1/sigma`` on every head and PLSH /
fixed blocks approximate exactly that kernel. "none" is NoPE: no bias and no
rope (every model here trains without rope), i.e. the causal mask is the only
positional signal.

A mode whose ``<out>/<mode>/final`` already exists is not retrained (rerun
the evaluation alone after an interruption); ``--retrain`` forces it.
Writes ``<results>/replication.json``, ``replication.md`` and ``replication.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a clone without installing

#: Trained modes: name -> (attention overrides, evaluation mode spec).
MODES: dict[str, tuple[list[str], str]] = {
    "none": (["--attention.bias=none"], "none"),
    "alibi": (["--attention.bias=alibi"], "alibi"),
    "fixed": (["--attention.bias=fixed_blocks"], "fixed"),
    "plsh_s10": (["--attention.bias=plsh", "--attention.num_samples=10"], "plsh:s=10"),
    "plsh_s20": (["--attention.bias=plsh", "--attention.num_samples=20"], "plsh:s=20"),
}


def train_overrides(args: argparse.Namespace, mode: str, out_dir: Path) -> list[str]:
    """``--section.key=value`` overrides of one mode's run (all but the attention are shared)."""
    return [
        f"--run.out_dir={out_dir}", f"--run.name=replicate_{mode}", f"--run.seed={args.seed}",
        f"--run.max_steps={args.steps}", "--run.device=cpu",
        f"--data.seq_len={args.train_len}", f"--data.micro_batch_size={args.batch}", f"--data.seed={args.seed}",
        f"--attention.sigma={float(args.sigma)}", "--attention.rope=false",
        f"--optim.warmup_steps={max(1, args.steps // 10)}",
        "--parallel.sp_size=1", "--deepspeed.zero_stage=0",
        "--checkpoint.every_steps=0", "--checkpoint.resume=never", "--checkpoint.keep_last=1",
        "--logging.eval_every=0", "--logging.eval_batches=0", "--logging.progress=false",
        "--logging.every_steps=10",
        *MODES[mode][0],
    ]


def _settings(args: argparse.Namespace) -> dict:
    """The sweep's arguments for the report, paths relative to the repository (the report is committed)."""
    out = dict(vars(args))
    for key in ("config", "out", "results"):
        path = Path(out[key]).resolve()
        out[key] = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else out[key]
    out["command"] = "python launchers/replicate.py " + " ".join(sys.argv[1:])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "quickstart.toml"), help="base run config")
    p.add_argument("--out", default="runs/replication", help="run directories (checkpoints; not committed)")
    p.add_argument("--results", default="results/replication", help="small JSON + markdown + PNG")
    p.add_argument("--modes", default=",".join(MODES), help=f"subset of {list(MODES)}")
    p.add_argument("--train-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--sigma", type=float, default=32.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-windows", type=int, default=8, help="validation windows per length")
    p.add_argument("--eval-seeds", default="0,1", help="hash seeds of the PLSH evaluations")
    p.add_argument("--last-tokens", type=int, default=None,
                   help="also score the last K tokens of overlapping windows (default: train_len // 2; 0 = off)")
    p.add_argument("--retrain", action="store_true")
    p.add_argument("--train-only", action="store_true")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"--modes: unknown {bad}; choose from {list(MODES)}")
    out, results_dir = Path(args.out), Path(args.results)
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    timings: dict[str, float] = {}
    t_all = time.time()
    for mode in modes:
        run_dir = out / mode
        if (run_dir / "final" / "model.safetensors").is_file() and not args.retrain:
            print(f"[replicate] {mode}: reusing {run_dir / 'final'}", flush=True)
            continue
        cmd = [sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config", args.config,
               *train_overrides(args, mode, run_dir)]
        print(f"[replicate] train {mode}: {' '.join(cmd)}", flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True, env=env)
        timings[f"train_{mode}_s"] = round(time.time() - t0, 1)
        print(f"[replicate] {mode} trained in {timings[f'train_{mode}_s']} s", flush=True)
    if args.train_only:
        return 0

    from plsh_dist.eval.replication import replicate_report

    t0 = time.time()
    replicate_report(out, modes, {m: MODES[m][1] for m in modes}, results_dir, train_len=args.train_len,
                     windows=args.eval_windows, seeds=[int(s) for s in args.eval_seeds.split(",")],
                     settings=_settings(args), timings=timings,
                     last_tokens=args.train_len // 2 if args.last_tokens is None else (args.last_tokens or None))
    timings["eval_s"] = round(time.time() - t0, 1)
    print(f"[replicate] total {time.time() - t_all:.0f} s; results in {results_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
