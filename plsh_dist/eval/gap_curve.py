"""The PLSH-to-exact-ALiBi gap against the number of hash samples s.

From a replication report (``plsh_dist.eval.replication``), every mode named
``plsh_s{s}_{sampler}_{sigma}`` gives one point per context length: its
perplexity ratio to the reference mode (exact ALiBi), paired over the same
windows and training seeds, with

- the confidence interval over windows (``ratio_ci`` of the summary), and
- the spread over training seeds: each seed's own paired ratio
  ``exp(mean_w (loss_mode - loss_ref))`` (``seed_ratios`` of the summary), as
  mean ± std and max. Separately
  trained models differ by more than the windows' interval says, so a gap
  target is read on the worst seed as well as on the mean.

``launchers/replicate.py`` writes ``gap.md`` and ``gap.png`` with it when the
grid holds the reference and PLSH modes at two or more s.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any


__all__ = ["gap_rows", "format_gap", "plot_gap", "PLSH_MODE"]

#: ``plsh_s{s}_{sampler}_{sigma}``: the PLSH mode names of ``launchers/replicate.py``.
PLSH_MODE = re.compile(r"^plsh_s(?P<s>\d+)_(?P<sampler>[a-z]+)_(?P<sigma>[a-z]+)$")


def gap_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (corpus, sampler, sigma, s, length) of the PLSH modes, sorted by s."""
    reference = results.get("reference")
    if not reference:
        return []
    out = []
    for rec in results["summary"]:
        m = PLSH_MODE.match(rec["mode"])
        if not m or "ratio_to_reference" not in rec:
            continue
        per_seed = rec["seed_ratios"]
        out.append({"corpus": rec["corpus"], "mode": rec["mode"], "s": int(m["s"]), "sampler": m["sampler"],
                    "sigma": m["sigma"], "length": rec["length"], "ratio": rec["ratio_to_reference"],
                    "ratio_ci": rec["ratio_ci"], "seed_ratios": per_seed,
                    "seed_mean": statistics.fmean(per_seed) if per_seed else math.nan,
                    "seed_std": statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0,
                    "seed_max": max(per_seed) if per_seed else math.nan})
    return sorted(out, key=lambda r: (r["corpus"], r["sampler"], r["sigma"], r["s"], r["length"]))


def format_gap(results: dict[str, Any], target: float = 1.03) -> str:
    """Markdown: per corpus and (sampler, sigma), the ratio to the reference against s at every length."""
    rows = gap_rows(results)
    if not rows:
        return ""
    ref, train_len = results["reference"], results["train_len"]
    lengths = sorted({r["length"] for r in rows})
    out = [f"Perplexity ratio of PLSH to {ref} against s: paired ratio over {len(rows[0]['seed_ratios'])} "
           f"training seed(s) [95% CI over windows]; below it, each seed's own ratio as mean ± std (max). "
           f"Target: <= {target:g} at every length.\n"]
    for corpus, sampler, sigma in dict.fromkeys((r["corpus"], r["sampler"], r["sigma"]) for r in rows):
        sub = [r for r in rows if (r["corpus"], r["sampler"], r["sigma"]) == (corpus, sampler, sigma)]
        out.append(f"**{corpus}, sampler {sampler}, sigma {'per head' if sigma == 'h' else 'constant'}**\n")
        out.append("| s | " + " | ".join(f"L={L} ({L / train_len:g}x)" for L in lengths)
                   + " | within target: mean / every seed |")
        out.append("|---|" + "---|" * len(lengths) + "---|")
        for s in sorted({r["s"] for r in sub}):
            cell = {r["length"]: r for r in sub if r["s"] == s}
            texts, ok, ok_all = [], True, True
            for L in lengths:
                r = cell.get(L)
                if r is None:
                    texts.append("–")
                    ok = ok_all = False
                    continue
                lo, hi = r["ratio_ci"]
                texts.append(f"{r['ratio']:.3f} [{lo:.3f}, {hi:.3f}]<br>{r['seed_mean']:.3f} ± {r['seed_std']:.3f} "
                             f"({r['seed_max']:.3f})")
                ok = ok and r["ratio"] <= target
                ok_all = ok_all and r["seed_max"] <= target
            out.append(f"| {s} | " + " | ".join(texts) + f" | {'yes' if ok else 'no'} / {'yes' if ok_all else 'no'} |")
        out.append("")
    return "\n".join(out) + "\n"


def plot_gap(results: dict[str, Any], path: str | Path, target: float = 1.03) -> Path | None:
    """``gap.png``: ratio to the reference against s (log), one line per (sampler, sigma, length),
    error bars = std of the per-seed ratios; 1 and the target as dashed guides."""
    from plsh_dist.eval.plots import Series, line_plot

    rows = gap_rows(results)
    if len({r["s"] for r in rows}) < 2:
        return None
    panels = []
    for corpus in dict.fromkeys(r["corpus"] for r in rows):
        sub = [r for r in rows if r["corpus"] == corpus]
        series = []
        for key in dict.fromkeys((r["sampler"], r["sigma"], r["length"]) for r in sub):
            pts = sorted((r for r in sub if (r["sampler"], r["sigma"], r["length"]) == key), key=lambda r: r["s"])
            series.append(Series(f"{key[0]}, sigma {key[1]}, L={key[2]}", [p["s"] for p in pts],
                                 [p["ratio"] for p in pts], yerr=[p["seed_std"] for p in pts]))
        span = [min(r["s"] for r in sub), max(r["s"] for r in sub)]
        series += [Series("ALiBi", span, [1.0, 1.0], style="k-"),
                   Series(f"target {target:g}", span, [target, target], style="--", kwargs={"color": "grey"})]
        panels.append((f"{corpus}: trained at L={results['train_len']}", series))
    return line_plot(path, panels, xlabel="hash samples s (training and evaluation)",
                     ylabel=f"perplexity / {results['reference']} (paired)", logx=True, logy=False)
