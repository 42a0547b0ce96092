"""Training throughput (tokens/s) of a model preset: PLSH (per sample, one pass) versus exact ALiBi, side by side.

    python benchmarks/bench_training.py [--lengths 8192,16384] \
        [--modes plsh:per_sample:8,plsh:onepass:8,plsh:onepass:64,alibi]

A mode is ``bias[:method[:s]]`` (``[attention].bias``, ``.method``, ``.num_samples``;
s defaults to ``--samples``).

One process, fp32, batch 1: a full training step (forward, backward, AdamW
update; the hash masks change every step as in training) on random tokens,
timed after a warm-up step. Prints a table and writes JSON to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, presets


def attention_of(mode: str, default_samples: int) -> AttentionConfig:
    """``bias[:method[:s]]`` -> the AttentionConfig it names."""
    bias, method, samples = (mode.split(":") + ["auto", str(default_samples)][len(mode.split(":")) - 1:])[:3]
    return AttentionConfig(bias=bias, method=method, num_samples=int(samples), rope=False)


def step_times(mode: str, seq_len: int, args) -> list[float]:
    """Wall seconds of ``args.steps`` timed training steps (after ``args.warmup``)."""
    torch.manual_seed(0)
    model_cfg = dataclasses.replace(presets[args.preset], vocab_size=args.vocab)
    attn = attention_of(mode, args.samples)
    runtime = AttentionRuntime(run_seed=0)
    model = build_model(model_cfg, attn, runtime)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (1, seq_len + 1), generator=gen)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(seq_len).unsqueeze(0)
    times = []
    for step in range(args.warmup + args.steps):
        runtime.set_step(step, 0)
        t = time.perf_counter()
        logits = model(input_ids=inputs, position_ids=positions).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--vocab", type=int, default=2048, help="vocabulary (the quickstart tokenizer's)")
    p.add_argument("--lengths", default="8192,16384")
    p.add_argument("--modes", default="plsh:per_sample:8,plsh:onepass:8,plsh:onepass:64,alibi",
                   help="comma-separated bias[:method[:s]] to compare (the first is the ratios' reference)")
    p.add_argument("--samples", type=int, default=8, help="PLSH hash samples s")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch default)")
    p.add_argument("--out", default="bench_results/training_throughput.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    modes = args.modes.split(",")
    rows = []
    for seq_len in (int(x) for x in args.lengths.split(",")):
        row = {"seq_len": seq_len}
        for mode in modes:
            times = step_times(mode, seq_len, args)
            best = min(times)  # least disturbed by other processes on a shared machine
            row[mode] = {"tokens_per_s": seq_len / best, "step_s": best, "all_step_s": times}
            print(f"  T={seq_len:>6} {mode:<22} {seq_len / best:>10.0f} tokens/s  ({best:.2f} s/step)", flush=True)
        rows.append(row)

    print(f"\ntraining throughput (tokens/s, and x {modes[0]}), preset {args.preset}, fp32 CPU "
          f"({torch.get_num_threads()} threads), batch 1")
    print(f"{'seq_len':>8} " + " ".join(f"{m:>24}" for m in modes))
    for row in rows:
        ref = row[modes[0]]["tokens_per_s"]
        cells = [f"{row[m]['tokens_per_s']:.0f} ({row[m]['tokens_per_s'] / ref:.2f}x)" for m in modes]
        print(f"{row['seq_len']:>8} " + " ".join(f"{c:>24}" for c in cells))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"preset": args.preset, "samples": args.samples, "threads": torch.get_num_threads(),
                               "cpu_count": os.cpu_count(), "rows": rows}, indent=2) + "\n")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
