"""How far bf16 training drifts from fp32: the quickstart model under each precision setting.

    python experiments/precision_drift.py --out results/precision [--steps 250]

Trains configs/quickstart.toml (the tiny Qwen3, PLSH s = 4, 256 tokens, 8
sequences a step) in one CPU process (SP = 1: the same batches and
arithmetic as the quickstart's SP = 2), under the pinned CPU code paths, once per
setting: fp32; bf16 with fp32 master weights (``precision = "bf16"``, what
``auto`` means on a GPU); bf16 master weights (``master_weights = "bf16"``, the
paper's precision: bf16 weights, gradients and AdamW moments). All three start
from the same initial weights and see the same batches and hash masks. Writes
``drift.json`` (every step's loss) and ``README.md`` (the table) to ``--out``.
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
sys.path.insert(0, str(ROOT))

from plsh_dist.cpu_paths import pinned_cpu_env  # noqa: E402  (imports no torch)

SETTINGS = {
    "fp32": ["--deepspeed.precision=fp32"],
    "bf16, fp32 master weights": ["--deepspeed.precision=bf16"],
    "bf16 master weights (the paper's)": ["--deepspeed.precision=bf16", "--deepspeed.master_weights=bf16"],
}


def train(out: Path, steps: int, extra: list[str]) -> tuple[list[dict], float]:
    """One run of the quickstart config in ``out`` -> (its metrics.jsonl records, wall seconds)."""
    cmd = [sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config", str(ROOT / "configs" / "quickstart.toml"),
           "--parallel.sp_size=1", f"--run.max_steps={steps}", f"--run.out_dir={out}", "--checkpoint.every_steps=0",
           "--checkpoint.export_safetensors=false", "--logging.tensorboard=false", "--checkpoint.resume=never",
           "--logging.every_steps=1", *extra]
    env = {**pinned_cpu_env(), "DS_ACCELERATOR": "cpu", "PLSH_PROGRESS": "0", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.time()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return records, time.time() - t0


def table(runs: dict[str, dict]) -> str:
    """Markdown rows: each setting's losses and their gap to fp32's (every step is logged)."""
    base = runs["fp32"]["losses"]
    rows = ["| setting | loss, step 1 | loss, last step | mean loss, last 50 steps | max abs gap to fp32, any step | "
            "mean abs gap, last 50 steps | validation loss | wall (s) |", "|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        losses = run["losses"]
        gaps = [abs(a - b) for a, b in zip(losses, base)]
        rows.append(f"| {name} | {losses[0]:.4f} | {losses[-1]:.4f} | {sum(losses[-50:]) / len(losses[-50:]):.4f} | "
                    f"{max(gaps):.4f} | {sum(gaps[-50:]) / len(gaps[-50:]):.4f} | {run['val_loss']:.4f} | "
                    f"{run['wall_s']:.0f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=250)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for i, (name, extra) in enumerate(SETTINGS.items()):
        records, wall = train(args.out / f"run{i}", args.steps, extra)
        steps = [r for r in records if "loss" in r]
        assert [r["step"] for r in steps] == list(range(1, args.steps + 1)), "every step is logged"
        val = [r["val_loss"] for r in records if "val_loss" in r]
        runs[name] = {"overrides": extra, "losses": [r["loss"] for r in steps], "val_loss": val[-1] if val else None,
                      "wall_s": wall}
        print(f"{name}: loss {runs[name]['losses'][0]:.4f} -> {runs[name]['losses'][-1]:.4f}, {wall:.0f} s", flush=True)
    (args.out / "drift.json").write_text(json.dumps(runs, indent=1) + "\n")
    (args.out / "table.md").write_text(table(runs) + "\n")
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
