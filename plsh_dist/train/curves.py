"""``training_curves.png``: loss, learning rate and tokens/s against the step, from ``metrics.jsonl``.

Written by rank 0 when a run ends (finished, preempted or interrupted), next to
the metrics it plots; the evaluation's ``ppl_vs_length.png`` conventions
(``plsh_dist.eval.plots``: matplotlib's Agg backend, one row of panels).
"""

from __future__ import annotations

import json
from pathlib import Path

CURVES_FILE = "training_curves.png"


def write_training_curves(out_dir: str | Path) -> Path | None:
    """Plot ``out_dir/metrics.jsonl`` into ``out_dir/training_curves.png``; None when nothing was logged."""
    from plsh_dist.eval.plots import Series, line_plot  # matplotlib only when a run ends

    out_dir = Path(out_dir)
    metrics = out_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] \
        if metrics.is_file() else []
    train = [r for r in records if "loss" in r]
    if not train:
        return None
    steps = [r["step"] for r in train]
    val = [r for r in records if "val_loss" in r]
    loss = [Series("train", steps, [r["loss"] for r in train], style="-")]
    if val:
        loss.append(Series("validation", [r["step"] for r in val], [r["val_loss"] for r in val], style="o"))
    panels = [("loss", loss),
              ("learning rate", [Series("lr", steps, [r["lr"] for r in train], style="-")]),
              ("tokens/s", [Series("tokens/s", steps, [r["tokens_per_s"] for r in train], style="-")])]
    return line_plot(out_dir / CURVES_FILE, panels, xlabel="optimizer step", ylabel="", logx=False, logy=False)
