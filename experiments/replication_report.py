"""Report of the CPU-scale replication (``experiments/replicate.py``): every trained model
(corpus x mode x training seed) evaluated in its own attention mode at several
multiples of its train length, on the same target tokens at every length.

Per (corpus, mode, length) the report gives the perplexity's mean ± std over
training seeds (each seed's value is its mean over hash seeds for PLSH), the
mean of the seeds' confidence intervals over windows, and the perplexity
ratio to a reference mode, paired over the same windows and seeds:
``exp(mean_w mean_seed (loss_mode - loss_ref))`` with a confidence interval
over windows and one over training seeds (t interval of the seeds' own
log-ratios: the one that counts, as separately trained models differ by far
more than their windows do). Writes ``replication.json`` (settings, per-run training
summary, every row with its window losses), ``replication.md`` and
``replication.png`` (perplexity vs context length, one panel per corpus,
error bars = std over training seeds), and with PLSH modes ``gap.md`` /
``gap.png``: the ratio to the reference against s (:mod:`experiments.gap_curve`).

A written report can be read again against another reference mode, without
evaluating anything (the ratio tables only)::

    python -m experiments.replication_report results/quality_gap_seeds/replication.json \
        --reference plsh_s8_iid_h --modes trunc_s8_h
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from experiments.gap_curve import format_gap, plot_gap
from plsh_dist.checkpoint.loading import load_model
from plsh_dist.eval.eval_data import load_eval_tokens
from plsh_dist.eval.extrapolation import EvalSettings, evaluate_model
from plsh_dist.eval.mode_specs import parse_modes
from plsh_dist.eval.scoring import mean_ci

__all__ = ["replicate_report", "replication_lengths", "summarize", "format_report", "plot_report", "reusable_runs",
           "PROTOCOL"]

#: Settings of ``experiments/replicate.py`` that fix a run and its evaluation: an earlier report's
#: runs stand in for new ones only when all of them agree.
PROTOCOL = ("config", "prose_dir", "code_dir", "train_len", "steps", "batch", "sigma", "stratified_sampler",
            "multiples", "last_tokens", "eval_windows", "eval_seeds", "reference")

RunKey = tuple[str, str, int]  # (corpus, mode, training seed)


def replication_lengths(train_len: int, multiples: Sequence[float] = (1, 2, 4, 8)) -> list[int]:
    """``multiples`` x the train length (rounded to whole tokens)."""
    return [round(float(m) * train_len) for m in multiples]


def _colour(i: int):
    """A distinct colour per mode (the grid outgrows matplotlib's 10-colour default cycle)."""
    import matplotlib

    return matplotlib.colormaps["tab20"](i % 20)


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


def summarize(rows: list[dict[str, Any]], reference: str | None, ci_level: float = 0.95) -> list[dict[str, Any]]:
    """One record per (corpus, mode, length): mean ± std over training seeds and the paired
    ratio to ``reference`` (see the module doc). Rows need ``corpus``, ``mode``, ``train_seed``."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["corpus"], r["mode"], r["length"]), []).append(r)
    out = []
    for (corpus, mode, length), rs in cells.items():
        rs = sorted(rs, key=lambda r: r["train_seed"])
        ppl = [r["perplexity_mean"] for r in rs]
        rec = {"corpus": corpus, "mode": mode, "length": length, "train_seeds": [r["train_seed"] for r in rs],
               "perplexity_mean": statistics.fmean(ppl),
               "perplexity_std": statistics.stdev(ppl) if len(ppl) > 1 else 0.0,
               "loss_mean": statistics.fmean(r["loss_mean"] for r in rs),
               "perplexity_ci_mean": [statistics.fmean(r["perplexity_ci"][i] for r in rs) for i in (0, 1)],
               "hash_std_mean": statistics.fmean(r["perplexity_std"] for r in rs),
               "targets": rs[0]["targets"], "windows": rs[0]["windows"],
               "scored_per_window": rs[0]["scored_per_window"]}
        ref = {r["train_seed"]: r for r in cells.get((corpus, reference, length), [])} if reference else {}
        paired = [(r, ref[r["train_seed"]]) for r in rs if r["train_seed"] in ref
                  and ref[r["train_seed"]]["targets"] == r["targets"]]
        if paired and mode != reference:
            per_seed = [np.asarray(a["window_loss"]) - np.asarray(b["window_loss"]) for a, b in paired]
            diff = np.mean(per_seed, axis=0)
            c = mean_ci(diff, level=ci_level)
            seed_log = [float(d.mean()) for d in per_seed]  # each training seed's own log-ratio
            rec["seed_ratios"] = [math.exp(x) for x in seed_log]
            rec["ratio_to_reference"] = math.exp(c["mean"])
            rec["ratio_ci"] = [math.exp(c["low"]), math.exp(c["high"])] if c["n"] > 1 else [math.nan, math.nan]
            # Separately trained models decorrelate (the pairing by seed survives training only in
            # part), so the honest interval of the ratio is over seeds, not over windows.
            sc = mean_ci(seed_log, level=ci_level)
            rec["ratio_seed_ci"] = [math.exp(sc["low"]), math.exp(sc["high"])]  # NaN with one seed
            rec["seed_log_sd"] = statistics.stdev(seed_log) if len(seed_log) > 1 else math.nan
            rec["ratio_seeds"] = len(paired)
        out.append(rec)
    return out


def format_report(results: dict[str, Any]) -> str:
    """Markdown: per corpus, the perplexity table (mean ± std over training seeds) and the
    paired ratio table; then the settings that produced them."""
    summary, s = results["summary"], results["settings"]
    ref = results.get("reference")
    out = []
    for corpus in dict.fromkeys(r["corpus"] for r in summary):
        sub = [r for r in summary if r["corpus"] == corpus]
        lengths = sorted({r["length"] for r in sub})
        cell = {(r["mode"], r["length"]): r for r in sub}
        modes = list(dict.fromkeys(r["mode"] for r in sub))
        k = sub[0]["scored_per_window"]
        n_seeds = max(len(r["train_seeds"]) for r in sub)
        out.append(f"### {corpus} corpus\n")
        out.append(f"Validation perplexity, last {k} tokens of {sub[0]['windows']} windows, the same target tokens at "
                   f"every length; mean ± std over {n_seeds} training seed(s); "
                   f"[mean of the seeds' {results.get('ci_level', 0.95):.0%} CI over windows]\n")
        out.append("| mode | " + " | ".join(f"L={L} ({L / s['train_len']:g}x)" for L in lengths) + " |")
        out.append("|---|" + "---|" * len(lengths))
        for m in modes:
            cells = []
            for L in lengths:
                r = cell.get((m, L))
                if r is None:
                    cells.append("–")
                    continue
                text = f"{r['perplexity_mean']:.2f}"
                if len(r["train_seeds"]) > 1:
                    text += f" ± {r['perplexity_std']:.2f}"
                lo, hi = r["perplexity_ci_mean"]
                if math.isfinite(lo) and math.isfinite(hi):
                    text += f" [{lo:.1f}, {hi:.1f}]"
                cells.append(text)
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out.append("")
        if ref and any("ratio_to_reference" in r for r in sub):
            level = f"{results.get('ci_level', 0.95):.0%}"
            out.append(f"Perplexity ratio to {ref} (paired: same windows, same training seed); "
                       f"[{level} CI over windows]; {{{level} CI over training seeds}}, the wider and the one "
                       f"to read: separately trained models differ by more than their windows do\n")
            out.append("| mode | " + " | ".join(f"L={L}" for L in lengths) + " |")
            out.append("|---|" + "---|" * len(lengths))
            for m in modes:
                if m == ref:
                    continue
                cells = []
                for L in lengths:
                    r = cell.get((m, L))
                    if r is None or "ratio_to_reference" not in r:
                        cells.append("–")
                    else:
                        lo, hi = r["ratio_ci"]
                        text = f"{r['ratio_to_reference']:.3f} [{lo:.3f}, {hi:.3f}]"
                        slo, shi = r["ratio_seed_ci"]
                        if math.isfinite(slo) and math.isfinite(shi):
                            text += f" {{{slo:.3f}, {shi:.3f}}}"
                        cells.append(text)
                out.append(f"| {m} | " + " | ".join(cells) + " |")
            out.append("")
    out.append(f"Settings: train length {s['train_len']}, {s['steps']} steps x {s['batch']} sequences, "
               f"sigma of the *_c modes {s['sigma']}, stratified sampler {s.get('stratified_sampler')}, "
               f"hash seeds {s['eval_seeds']}, training seeds {s['seeds']}. Command: `{s['command']}`\n")
    return "\n".join(out) + "\n"


def _run_key(name: str) -> RunKey:
    corpus, mode, seed = name.split("/")
    return corpus, mode, int(seed.removeprefix("seed"))


def reusable_runs(prior: dict[str, Any], settings: dict[str, Any]) -> set[RunKey]:
    """The runs of an earlier report ``prior`` (its ``replication.json``) that may stand in for new
    ones under ``settings``. Raises ``ValueError`` naming each protocol setting that differs."""
    old = prior["settings"]
    diff = [f"{k}: report {old.get(k)!r}, now {settings.get(k)!r}" for k in PROTOCOL if old.get(k) != settings.get(k)]
    if diff:
        raise ValueError("--reuse: the report was made under another protocol (" + "; ".join(diff)
                         + "); rerun with its settings (its command is in its replication.md) or without --reuse")
    return {_run_key(name) for name in prior["runs"]}


def _check_reused(fresh: list[dict[str, Any]], prior: list[dict[str, Any]], key: RunKey) -> None:
    """Raise ``ValueError`` unless a run trained and evaluated again gives the report's window losses."""
    def losses(rows):
        return {(r["length"], r["eval_mode"], r["scoring"]): r["window_loss"] for r in rows}

    if losses(fresh) != losses(prior):
        raise ValueError(f"--reuse: {'/'.join(map(str, key))} trained and evaluated again does not give the "
                         "report's window losses; the code changed the numbers since the report, so its runs "
                         "cannot be reused: rerun without --reuse")


def replicate_report(runs_dir: str | Path, corpora: Sequence[str], modes: Sequence[str], train_seeds: Sequence[int],
                     eval_specs: dict[str, str], results_dir: str | Path, *, lengths: Sequence[int], train_len: int,
                     windows: int, hash_seeds: Sequence[int], last_tokens: int, reference: str | None,
                     settings: dict[str, Any], timings: dict[str, float], ci_level: float = 0.95,
                     reuse: dict[str, Any] | None = None, checks: set[RunKey] = frozenset()) -> dict[str, Any]:
    """Evaluate ``runs_dir/<corpus>/<mode>/seed<k>/final`` of every run; write the report to ``results_dir``.

    ``reuse``: an earlier report (its ``replication.json``, checked by :func:`reusable_runs`)
    whose runs are taken as they are, except those in ``checks``: evaluated again and required
    to match it (``ValueError`` if not)."""
    rows, runs = [], {}
    reused = reusable_runs(reuse, settings) if reuse else set()
    t_eval = time.time()
    for corpus in corpora:
        for mode in modes:
            for seed in train_seeds:
                key = (corpus, mode, seed)
                if key in reused:
                    prior_rows = [r for r in reuse["rows"] if (r["corpus"], r["mode"], r["train_seed"]) == key]
                    if key not in checks:
                        rows += prior_rows
                        runs[f"{corpus}/{mode}/seed{seed}"] = {**reuse["runs"][f"{corpus}/{mode}/seed{seed}"],
                                                               "reused": True}
                        continue
                t0 = time.time()
                run_dir = Path(runs_dir) / corpus / mode / f"seed{seed}"
                ck = load_model(run_dir / "final")
                tokens, data_desc = load_eval_tokens(ck, None)
                eval_settings = EvalSettings(lengths=lengths, modes=parse_modes(eval_specs[mode]), seeds=hash_seeds,
                                             scorings=("last",), last_tokens=last_tokens, max_windows=windows,
                                             progress=False, align=True, ci_level=ci_level)
                got = evaluate_model(ck.model, ck.trained_attention, tokens, eval_settings)
                for r in got:
                    r.update(corpus=corpus, mode=mode, eval_mode=r["mode"], train_seed=seed)
                if key in checks:
                    _check_reused(got, prior_rows, key)
                    print(f"[replicate] {corpus}/{mode}/seed{seed}: matches the reused report", flush=True)
                rows += got
                runs[f"{corpus}/{mode}/seed{seed}"] = {
                    **_training_summary(run_dir), "eval_s": round(time.time() - t0, 1), "data": data_desc,
                    "data_tokens": int(len(tokens)), "attention": ck.trained_attention.to_dict()}
                print(f"[replicate] evaluated {corpus}/{mode}/seed{seed} in {time.time() - t0:.1f} s", flush=True)
    summary = summarize(rows, reference, ci_level)
    results = {"settings": settings, "lengths": list(lengths), "train_len": train_len, "reference": reference,
               "ci_level": ci_level, "runs": runs, "timings": {**timings, "eval_s": round(time.time() - t_eval, 1)},
               "summary": summary, "rows": rows}
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replication.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "replication.md").write_text(format_report(results))
    plot_report(results, out / "replication.png")
    write_gap(results, out)
    return results


def write_gap(results: dict[str, Any], out: Path) -> None:
    """``gap.md`` and ``gap.png`` (:mod:`experiments.gap_curve`) when the grid has the reference and PLSH modes."""
    text = format_gap(results)
    if text:
        (out / "gap.md").write_text(text)
        plot_gap(results, out / "gap.png")


def plot_report(results: dict[str, Any], path: str | Path) -> Path:
    """``replication.png`` of a report (``results`` as in ``replication.json``): one panel per
    corpus, perplexity vs context length per mode, error bars = std over training seeds."""
    from plsh_dist.eval.extrapolation import ci_series
    from plsh_dist.eval.plots import line_plot

    summary = results["summary"]
    k = summary[0]["scored_per_window"] if summary else None
    panels = []
    for corpus in dict.fromkeys(r["corpus"] for r in summary):
        series = []
        for mode in dict.fromkeys(r["mode"] for r in summary):
            pts = sorted((r for r in summary if r["corpus"] == corpus and r["mode"] == mode), key=lambda r: r["length"])
            if pts:
                s = ci_series(mode, [{"length": p["length"], "perplexity_mean": p["perplexity_mean"],
                                      "perplexity_std": p["perplexity_std"]} for p in pts])
                s.kwargs["color"] = _colour(len(series))
                series.append(s)
        panels.append((f"{corpus}: trained at L={results['train_len']}, last {k} tokens", series))
    return line_plot(path, panels, xlabel="context length (tokens)",
                     ylabel="validation perplexity (± std over training seeds)", logx=True, logy=True)


def main(argv: list[str] | None = None) -> int:
    """Print a report's tables against ``--reference`` (any of its modes), from its rows."""
    p = argparse.ArgumentParser(description="a replication report's ratios against another reference mode")
    p.add_argument("report", type=Path, help="a replication.json")
    p.add_argument("--reference", required=True, help="the mode the paired ratios are taken against")
    p.add_argument("--modes", default=None, help="comma-separated modes to show (default: all)")
    args = p.parse_args(argv)
    results = json.loads(args.report.read_text())
    modes = set(args.modes.split(",")) if args.modes else {r["mode"] for r in results["rows"]}
    known = {r["mode"] for r in results["rows"]}
    if args.reference not in known or not modes <= known:
        p.error(f"--reference / --modes: the report holds the modes {sorted(known)}")
    rows = [r for r in results["rows"] if r["mode"] in modes | {args.reference}]
    print(format_report({**results, "reference": args.reference,
                         "summary": summarize(rows, args.reference, results.get("ci_level", 0.95))}), end="")
    return 0


if __name__ == "__main__":  # python -m experiments.replication_report, from the repository root
    sys.exit(main())
