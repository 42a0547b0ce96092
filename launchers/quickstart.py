"""Quickstart: corpus + tokenizer, a tiny Qwen3 with PLSH attention trained by 2 processes
(sequence parallel, SP = 2) through the deepspeed launcher on CPU, then validation perplexity
of the exported checkpoint and its length-extrapolation table (PLSH vs exact ALiBi vs no
bias at 1x, 2x and 4x the train length).

    python launchers/quickstart.py [--fresh] [--section.key=value ...]

Extra ``--section.key=value`` arguments override configs/quickstart.toml.
A bad config or bad data exits 2 with one ``config error:`` / ``data error:``
line before anything is replaced. ``--fresh`` (``make quickstart``) then moves
the previous run in out_dir aside and deletes it only once every step has
passed; if a step fails, the previous run is kept where the message says.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _deepspeed_cmd() -> list[str]:
    script = Path(sys.executable).parent / "deepspeed"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "deepspeed.launcher.runner"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "quickstart.toml"))
    parser.add_argument("--nproc", type=int, default=2, help="processes (SP = 2 needs 2)")
    parser.add_argument("--fresh", action="store_true",
                        help="start a new run (no resume): once the config and data are checked, the previous "
                             "run in out_dir is moved aside, and deleted when every step has passed")
    args, overrides = parser.parse_known_args()

    # One set of CPU code paths (one thread per rank among them) for the ranks and for this
    # process, which evaluates the checkpoint, so that the printed figures agree across x86-64
    # CPUs (docs/training.md). Set before torch is imported, which reads them.
    from plsh_dist.cpu_paths import pinned_cpu_env

    env = dict(pinned_cpu_env(), DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
    from plsh_dist.config import load_config
    from plsh_dist.distributed.ports import free_port
    from plsh_dist.train.run_dir import set_aside_previous_run
    from plsh_dist.train.run_lock import live_holder

    try:
        cfg = load_config(args.config, overrides)  # fails here, before any work, on a bad config
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(cfg.run.out_dir)
    t0 = time.time()

    print("[1/4] corpus, tokenizer and token caches", flush=True)
    from plsh_dist.data import prepare_data

    try:
        prepared = prepare_data(cfg.data, cfg.tokenizer)
    except ValueError as exc:  # an empty, binary or too small corpus: the user's to fix
        print(f"data error: {exc}", file=sys.stderr)
        return 2
    print(f"      tokenizer {cfg.tokenizer.model_path} (vocab {prepared.tokenizer.vocab_size}); "
          f"train {prepared.train.num_tokens:,} tokens, val {prepared.val.num_tokens if prepared.val else 0:,} tokens "
          f"({time.time() - t0:.0f} s)", flush=True)
    previous = None
    if args.fresh:  # checked: replace the previous run, kept aside until every step has passed
        busy = live_holder(out_dir)
        if busy is not None:
            print(f"out_dir error: {busy}", file=sys.stderr)
            return 2
        previous = set_aside_previous_run(out_dir)
        if previous is not None:
            print(f"      --fresh: previous run moved to {previous}; deleted once every step has passed, "
                  f"kept if one fails", flush=True)

    print(f"[2/4] training with {args.nproc} processes (deepspeed launcher, CPU)", flush=True)
    t1 = time.time()
    cmd = [*_deepspeed_cmd(), "--num_gpus", str(args.nproc), "--master_port", str(free_port()),
           str(ROOT / "launchers" / "pretrain.py"), "--config", args.config, *overrides]
    print("      " + " ".join(cmd), flush=True)
    try:
        rc = subprocess.call(cmd, env=env, cwd=os.getcwd())
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group: the ranks checkpoint their step
        print(f"interrupted (Ctrl-C): the ranks write their step's checkpoint to {out_dir / 'checkpoints'} and "
              f"stop (docs/training.md, Ctrl-C under the deepspeed launcher)", file=sys.stderr)
        return 130
    if rc != 0:
        kept = f"; the previous run is kept at {previous}" if previous is not None else ""
        print(f"training failed (exit {rc}){kept}", file=sys.stderr)
        return rc
    train_s = time.time() - t1

    print("[3/4] validation perplexity of the exported checkpoint", flush=True)
    from plsh_dist.train.validation import exported_validation

    ev = exported_validation(out_dir / "final")

    seq_len = cfg.data.seq_len
    lengths = [seq_len, 2 * seq_len, 4 * seq_len]
    print(f"[4/4] extrapolation: the same weights at {lengths} tokens, PLSH vs exact ALiBi vs no bias", flush=True)
    from plsh_dist.eval.extrapolation import EvalSettings, evaluate_checkpoint, format_table

    modes = f"plsh:s={cfg.attention.num_samples},alibi,none"
    # "last": the last seq_len tokens of each window, so every length scores the
    # same kind of tokens with more context before them.
    settings = EvalSettings(lengths=lengths, modes=modes, max_windows=8, scorings=("whole", "last"),
                            last_tokens=seq_len)
    extrapolation = evaluate_checkpoint(out_dir, settings, out_dir / "extrapolation")
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in records if "loss" in r]
    tps = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    tokens_per_step = cfg.data.micro_batch_size * cfg.optim.grad_accum_steps * cfg.data.seq_len * (
        args.nproc // cfg.parallel.sp_size)
    print("\nquickstart summary")
    if losses:
        print(f"  loss          : {losses[0][1]:.3f} (step {losses[0][0]}) -> {losses[-1][1]:.3f} (step {losses[-1][0]})")
    print(f"  training      : {cfg.run.max_steps} steps x {tokens_per_step:,} tokens in {train_s:.0f} s "
          f"(the launcher's wall time: start-up, validation, checkpoints and export included)")
    if tps:
        print(f"  tokens/s      : {sum(tps) / len(tps):,.0f} while stepping (all ranks together: tokens per step / "
              f"wall time since the previous step ended, mean over the {len(tps)} logged steps)")
    print(f"  val loss/ppl  : {ev['val_loss']:.3f} / {ev['val_ppl']:.1f} ({ev['tokens']:,} held-out tokens)")
    print(f"  total         : {time.time() - t0:.0f} s (this command: corpus, tokenizer, training, evaluation; "
          f"not the .venv set-up)")
    print(f"  extrapolation : {out_dir}/extrapolation/ (results.json, results.md: every scoring and metric, "
          f"ppl_vs_length.png)")
    print(f"  outputs       : {out_dir}/ metrics.jsonl, tensorboard/ (tensorboard --logdir {out_dir}/tensorboard),")
    print(f"                  checkpoints/, final/ (model.safetensors, config, tokenizer)\n")
    # One table: the last seq_len tokens of each window, the same targets at every length
    # (the whole-window scoring is in results.md).
    parts = format_table(extrapolation).split("\n\n")  # [title, table, title, table, ..., long table]
    title = next(i for i, part in enumerate(parts) if part.startswith("**perplexity** (last"))
    print(parts[title] + "\n\n" + parts[title + 1])
    if previous is not None:
        shutil.rmtree(previous)
        print(f"\n--fresh: deleted the previous run ({previous})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
