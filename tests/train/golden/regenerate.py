"""Regenerate tests/train/golden/debug_losses.json (after an intended numerical change).

    python tests/train/golden/regenerate.py [--check] [--only fp32|bf16]

Trains configs/debug.toml (1 process, CPU, 5 steps) from a fresh corpus and
tokenizer in a temporary directory, in fp32 once per PLSH method (the default, one
pass on CPU, and per sample) and in bf16 once per entry of ``BF16_RUNS`` (every ZeRO
stage, and bf16 master weights), under the pinned CPU code paths
(``plsh_dist.cpu_paths``), and writes the per-step losses, gradient norms and
validation loss together with the environment and code paths they were made in.
``--only``: rewrite one precision's runs and keep the other's as stored. ``--check``
compares instead of writing (exit 1 on a difference). Commit the new file with a
message that says which change moved the numbers and why that is intended.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run from a clone without installing
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", DS_ACCELERATOR="cpu", PLSH_PROGRESS="0")

from tests.train.golden.debug_run import (BF16_RUNS, GOLDEN, REGENERATE, environment,  # noqa: E402
                                          pinned_environment, prepare_debug_data, record, run_debug)

ABOUT = ("configs/debug.toml, 1 process, CPU, pinned CPU code paths: per-step losses and pre-clip gradient norms, "
         "final validation loss; fp32 at the top, per_sample: the same with --attention.method=per_sample; bf16: "
         "--deepspeed.precision=bf16 --optim.grad_clip=0 at each ZeRO stage, and with --deepspeed.master_weights=bf16. "
         f"Regenerate: {REGENERATE}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    parser.add_argument("--only", choices=("fp32", "bf16"), help="rewrite one precision's runs, keep the other's")
    args = parser.parse_args()
    stored = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    golden = {**stored, "about": ABOUT, "environment": environment()}
    fp32 = ("cpu_paths", "losses", "grad_norms", "val_loss", "per_sample")
    with tempfile.TemporaryDirectory(prefix="plsh_golden_") as work, pinned_environment():
        prepare_debug_data(Path(work))
        if args.only != "bf16":
            default, per_sample = run_debug(1, Path(work), [], ["--attention.method=per_sample"])
            golden.update(cpu_paths=default["cpu_paths"], **record(default), per_sample=record(per_sample))
        if args.only != "fp32":
            runs = run_debug(1, Path(work), *BF16_RUNS.values())
            golden["bf16"] = {"cpu_paths": runs[0]["cpu_paths"],
                              **{name: record(run) for name, run in zip(BF16_RUNS, runs)}}
    if args.check:
        keys = {"fp32": fp32, "bf16": ("bf16",)}.get(args.only, (*fp32, "bf16"))
        same = all(stored.get(k) == golden[k] for k in keys)
        print(json.dumps({"stored": stored, "now": golden}, indent=2))
        return 0 if same else 1
    GOLDEN.write_text(json.dumps(golden, indent=2) + "\n")
    print(f"wrote {GOLDEN}: losses {golden['losses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
