"""Report of the CPU-scale replication (``launchers/replicate.py``): each trained
model evaluated in its own attention mode at 1x, 1.25x and 2x its train length.

Writes ``replication.json`` (settings, per-run training wall time and final
loss, every result row), ``replication.md`` (the perplexity table plus the
long table) and ``replication.png`` (perplexity vs context length, one line per
trained mode).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from plsh_dist.eval.checkpoint_loading import load_for_eval
from plsh_dist.eval.eval_data import load_eval_tokens
from plsh_dist.eval.extrapolation import evaluate_model, format_table
from plsh_dist.eval.modes import parse_modes

__all__ = ["replicate_report", "replication_lengths"]


def replication_lengths(train_len: int) -> list[int]:
    """1x, 1.25x and 2x the train length (rounded to whole tokens)."""
    return [train_len, round(1.25 * train_len), 2 * train_len]


def _training_summary(run_dir: Path) -> dict[str, Any]:
    """Last logged step, loss and wall time of a run (its metrics.jsonl)."""
    path = run_dir / "metrics.jsonl"
    last: dict[str, Any] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "loss" in rec:
                last = rec
    return {"steps": last.get("step"), "final_train_loss": last.get("loss"), "train_wall_s": last.get("time_s")}


def replicate_report(runs_dir: str | Path, modes: Sequence[str], eval_specs: dict[str, str], results_dir: str | Path,
                     *, train_len: int, windows: int, seeds: Sequence[int], settings: dict[str, Any],
                     timings: dict[str, float], last_tokens: int | None = None) -> dict[str, Any]:
    """Evaluate ``runs_dir/<mode>/final`` of every mode; write the report to ``results_dir``.

    ``last_tokens``: also score the last K tokens of overlapping windows. Whole-window
    scores at different lengths cover different text (more windows of a longer
    length reach further into the data); the last-K scores of the same number of
    windows cover nearly the same tokens at every length (spans shifted by
    L - K), so they compare context lengths on the same text.
    """
    from plsh_dist.eval.plots import Series, line_plot

    lengths = replication_lengths(train_len)
    rows, runs = [], {}
    for mode in modes:
        t0 = time.time()
        ck = load_for_eval(Path(runs_dir) / mode / "final")
        tokens, data_desc = load_eval_tokens(ck, None)
        spec = parse_modes(eval_specs[mode])
        scorings = ("whole", "last") if last_tokens else ("whole",)
        got = evaluate_model(ck.model, ck.trained_attention, tokens, lengths, spec, seeds=seeds, scorings=scorings,
                             last_tokens=last_tokens, max_windows=windows, progress=True)
        for r in got:
            r["trained_mode"] = mode
            r["mode"] = mode  # the table's row label: the trained model (evaluated in its own mode)
        rows += got
        runs[mode] = {**_training_summary(Path(runs_dir) / mode), "eval_s": round(time.time() - t0, 1),
                      "eval_spec": eval_specs[mode], "data": data_desc, "data_tokens": int(len(tokens))}
    results = {"settings": settings, "lengths": lengths, "runs": runs, "timings": timings, "rows": rows}
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replication.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "replication.md").write_text(format_table(results))
    panels = []
    for scoring in dict.fromkeys(r["scoring"] for r in rows):
        series = []
        for mode in modes:
            pts = sorted((r for r in rows if r["mode"] == mode and r["scoring"] == scoring), key=lambda r: r["length"])
            series.append(Series(mode, [p["length"] for p in pts], [p["perplexity_mean"] for p in pts],
                                 yerr=[p["perplexity_std"] for p in pts]))
        what = "all tokens" if scoring == "whole" else f"last {last_tokens} tokens"
        panels.append((f"trained at L={train_len}; {what}", series))
    line_plot(out / "replication.png", panels, xlabel="context length (tokens)",
              ylabel="validation perplexity", logx=True, logy=True)
    return results
