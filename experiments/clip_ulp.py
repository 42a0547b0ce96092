"""How far one ulp of the gradient-clipping coefficient moves the pinned debug runs, fp32 and bf16.

    python experiments/clip_ulp.py

The pinned debug run's one CPU-dependent bit is DeepSpeed's square root of the
gradient norm (results/cpu_paths): it sets the clip coefficient of every
update. Moving ``[optim].grad_clip`` from 1 to 1 +- one fp32 ulp moves that
coefficient by the same one ulp, natively, on one CPU. Prints, per run (fp32,
and each bf16 run of ``BF16_RUNS`` with clipping put back at 1 +- ulp), the
largest relative change of the losses, gradient norms and validation loss
against the golden file's runs made without the change (fp32: the pinned run;
bf16: its unclipped run). The figures are quoted in results/cpu_paths/bf16.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", DS_ACCELERATOR="cpu", PLSH_PROGRESS="0")

from tests.train.golden.debug_run import (BF16_RUNS, pinned_environment,  # noqa: E402
                                          prepare_debug_data, run_debug)

ULP = {"1 + ulp": "1.0000001192092896", "1 - ulp/2": "0.9999999403953552"}  # the floats next to 1.0


def _rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def main() -> int:
    clipped = {name: [a for a in args if not a.startswith("--optim.grad_clip")] for name, args in BF16_RUNS.items()}
    runs = {("fp32", "1"): []}
    for name, args in {"fp32": [], **clipped}.items():
        runs[(name, "1")] = [*args, "--optim.grad_clip=1.0"]
        for label, clip in ULP.items():
            runs[(name, label)] = [*args, f"--optim.grad_clip={clip}"]
    with tempfile.TemporaryDirectory(prefix="plsh_clip_ulp_") as work, pinned_environment():
        prepare_debug_data(Path(work))
        results = dict(zip(runs, run_debug(1, Path(work), *runs.values())))
    print("| run | clip | losses | gradient norms | validation loss |\n|---|---|---|---|---|")
    for (name, label), res in results.items():
        if label == "1":
            continue
        ref = results[(name, "1")]
        print(f"| {name} | {label} | {_rel(res['losses'], ref['losses']):.2g} | "
              f"{_rel(res['grad_norms'], ref['grad_norms']):.2g} | "
              f"{_rel([res['val_loss']], [ref['val_loss']]):.2g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
