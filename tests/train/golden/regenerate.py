"""Regenerate tests/train/golden/debug_losses.json (after an intended numerical change).

    python tests/train/golden/regenerate.py [--check]

Trains configs/debug.toml (1 process, CPU, fp32, 5 steps) from a fresh corpus and
tokenizer in a temporary directory, once per PLSH method (the default, one pass on
CPU, and per sample), under the pinned CPU code paths (``plsh_dist.cpu_paths``), and
writes the per-step losses, gradient norms and validation loss together with the
environment and code paths they were made in. ``--check``
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

from tests.train.golden.debug_run import (GOLDEN, REGENERATE, environment, pinned_environment,  # noqa: E402
                                          prepare_debug_data, record, run_debug)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="plsh_golden_") as work, pinned_environment():
        prepare_debug_data(Path(work))
        default, per_sample = run_debug(1, Path(work), [], ["--attention.method=per_sample"])
    golden = {
        "about": "configs/debug.toml, 1 process, CPU fp32, pinned CPU code paths: per-step losses and pre-clip "
                 f"gradient norms, final validation loss; per_sample: the same with --attention.method=per_sample. "
                 f"Regenerate: {REGENERATE}",
        "environment": environment(),
        "cpu_paths": default["cpu_paths"],
        **record(default),
        "per_sample": record(per_sample),
    }
    if args.check:
        stored = json.loads(GOLDEN.read_text())
        same = all(stored.get(k) == golden[k] for k in ("cpu_paths", "losses", "grad_norms", "val_loss", "per_sample"))
        print(json.dumps({"stored": stored, "now": golden}, indent=2))
        return 0 if same else 1
    GOLDEN.write_text(json.dumps(golden, indent=2) + "\n")
    print(f"wrote {GOLDEN}: losses {golden['losses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
