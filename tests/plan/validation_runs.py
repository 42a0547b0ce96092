"""Planner estimate vs measured peak of real CPU training runs (one process, fp32 and bf16).

Run as a script by tests/plan/test_plan_validation.py (a fresh process, so
nothing of the test session is in the measurement):

    python tests/plan/validation_runs.py WORK_DIR > results.json

configs/debug.toml and configs/quickstart.toml (both the tiny Qwen3, with
4 and 8 sequences per micro-batch) at three sequence lengths each, on the
debug corpus and tokenizer; plus two variants that take other branches of
the estimate (ZeRO 0: no DeepSpeed bucket; activation checkpointing; the
plain loss); and bf16 at every ZeRO stage, with fp32 and with bf16 master
weights (each stage a DeepSpeed wrapper of its own). Each run: ``plan_run(..., device="cpu")`` then
``measure_cpu_peak`` (two real optimizer steps).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RUNS = [
    ("configs/debug.toml", 512, []),
    ("configs/debug.toml", 1024, []),
    ("configs/debug.toml", 2048, []),
    ("configs/quickstart.toml", 256, []),
    ("configs/quickstart.toml", 512, []),
    ("configs/quickstart.toml", 1024, []),
    ("configs/debug.toml", 2048, ["--deepspeed.zero_stage=0", "--memory.activation_checkpointing=true"]),
    ("configs/quickstart.toml", 1024, ["--deepspeed.zero_stage=0", "--memory.loss_chunk_tokens=0"]),
    *(("configs/debug.toml", 1024, ["--deepspeed.precision=bf16", f"--deepspeed.zero_stage={stage}"])
      for stage in (0, 1, 2, 3)),
    ("configs/debug.toml", 1024, ["--deepspeed.precision=bf16", "--deepspeed.zero_stage=1",
                                  "--deepspeed.master_weights=bf16"]),
]


def run_overrides(work: Path, config: str, seq_len: int, extra: list[str]) -> list[str]:
    """``config``'s model, attention, optim and deepspeed sections and micro-batch on the
    debug data in ``work``, one CPU process, at ``seq_len``; fp32 unless ``extra`` says otherwise."""
    from tests.train.golden.debug_run import _literal, debug_overrides

    table = tomllib.loads((ROOT / config).read_text())
    own = [f"--{section}.{key}={_literal(value)}" for section in ("model", "attention", "optim", "deepspeed")
           for key, value in table[section].items()]
    # The debug run's steps are the first of the config's schedule (its warmup may be longer than them).
    own.append(f"--optim.decay_end={table['optim'].get('decay_end') or table['run']['max_steps']}")
    return [*debug_overrides(work), *own, f"--data.micro_batch_size={table['data']['micro_batch_size']}",
            f"--data.seq_len={seq_len}", '--deepspeed.precision="fp32"', "--parallel.sp_size=1",
            f"--run.out_dir={work / 'out'}", *extra]


def main(work: Path) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    from plsh_dist.config import load_config
    from plsh_dist.plan import plan_run
    from plsh_dist.train.peak_measure import measure_cpu_peak
    from tests.train.golden.debug_run import prepare_debug_data

    prepare_debug_data(work)
    results = []
    for config, seq_len, extra in RUNS:
        cfg = load_config(None, run_overrides(work, config, seq_len, extra))
        plan = plan_run(cfg, world_size=1, device="cpu")
        measured, repeats = measure_cpu_peak(cfg), 1
        if measured > 1.25 * plan.memory.peak:
            # Seen once in a full CI run under heavy load: a peak one DeepSpeed gradient bucket
            # (1.9 GB) above every other measurement of the same run. A second measurement tells
            # a spurious allocation from an underestimate (which both would show); keep the lower.
            measured, repeats = min(measured, measure_cpu_peak(cfg)), 2
        results.append({"config": config, "seq_len": seq_len, "batch": cfg.data.micro_batch_size, "extra": extra,
                        "estimate": plan.memory.peak, "at": plan.memory.peak_at,
                        "buckets": plan.memory.states.buckets, "measured": measured, "measurements": repeats})
    return results


if __name__ == "__main__":
    out = main(Path(sys.argv[1]))
    print("RESULTS " + json.dumps(out))
