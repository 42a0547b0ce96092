"""The PLSH-to-exact-ALiBi gap against the number of hash samples s.

From a replication report (``experiments.replication_report``), every mode named
``plsh_s{s}_{sampler}_{sigma}``, or ``trunc_s{s}_{sigma}`` (exact ALiBi truncated
at the cost of s samples; its rows carry ``sampler="truncated"``), gives one
point per context length: its
perplexity ratio to the reference mode (exact ALiBi), paired over the same
windows and training seeds, with

- the confidence interval over windows (``ratio_ci`` of the summary), and
- the spread over training seeds: each seed's own paired ratio
  ``exp(mean_w (loss_mode - loss_ref))`` (``seed_ratios`` of the summary), its
  t interval over seeds (``ratio_seed_ci``) and max.

Separately trained models decorrelate, so a seed's paired ratio varies far
more than the windows' interval is wide (``results/quality_gap_seeds``). The
target is therefore judged on the seed interval, in three states: *within* (its upper end <= target), *outside* (its
lower end > target) or *unresolved*, with the number of seeds a +-(target - 1)
interval would need at the observed spread, ``(1.96 sd / ln target)^2``.

``experiments/replicate.py`` writes ``gap.md`` and ``gap.png`` with it when the
grid holds the reference and PLSH modes at two or more s.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Sequence


__all__ = ["gap_rows", "format_gap", "plot_gap", "verdict", "seeds_needed", "PLSH_MODE", "TRUNCATED_MODE",
           "TRUNCATED"]

#: ``plsh_s{s}_{sampler}_{sigma}``: the PLSH mode names of ``experiments/replicate.py``.
PLSH_MODE = re.compile(r"^plsh_s(?P<s>\d+)_(?P<sampler>[a-z]+)_(?P<sigma>[a-z]+)$")
#: ``trunc_s{s}_{sigma}``: truncated ALiBi at the cost of s samples.
TRUNCATED_MODE = re.compile(r"^trunc_s(?P<s>\d+)_(?P<sigma>[a-z]+)$")
#: The ``sampler`` of truncated ALiBi's rows (deterministic: no sampler).
TRUNCATED = "truncated"


def gap_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (corpus, sampler, sigma, s, length) of the PLSH and truncated modes, sorted by s."""
    reference = results.get("reference")
    if not reference:
        return []
    out = []
    for rec in results["summary"]:
        m = PLSH_MODE.match(rec["mode"]) or TRUNCATED_MODE.match(rec["mode"])
        if not m or "ratio_to_reference" not in rec:
            continue
        per_seed = rec["seed_ratios"]
        sampler = m.groupdict().get("sampler") or TRUNCATED
        out.append({"corpus": rec["corpus"], "mode": rec["mode"], "s": int(m["s"]), "sampler": sampler,
                    "sigma": m["sigma"], "length": rec["length"], "ratio": rec["ratio_to_reference"],
                    "ratio_ci": rec["ratio_ci"], "seed_ratios": per_seed,
                    "seed_ci": rec["ratio_seed_ci"], "seed_log_sd": rec["seed_log_sd"],
                    "seed_max": max(per_seed) if per_seed else math.nan})
    return sorted(out, key=lambda r: (r["corpus"], r["sampler"], r["sigma"], r["s"], r["length"]))


def verdict(seed_ci: Sequence[float], target: float) -> str:
    """``"within"``, ``"outside"`` or ``"unresolved"``: where the seed interval lies against ``target``."""
    lo, hi = seed_ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "unresolved"
    return "within" if hi <= target else "outside" if lo > target else "unresolved"


def seeds_needed(seed_log_sd: float, target: float) -> int | None:
    """Training seeds for a 95% interval of half-width ``ln target`` at per-seed spread ``seed_log_sd``."""
    if not math.isfinite(seed_log_sd) or target <= 1.0:
        return None
    return max(2, math.ceil((1.96 * seed_log_sd / math.log(target)) ** 2))


def _combined(verdicts: list[str]) -> str:
    """Every length within -> within; any outside -> outside; else unresolved."""
    if verdicts and all(v == "within" for v in verdicts):
        return "within"
    return "outside" if "outside" in verdicts else "unresolved"


def format_gap(results: dict[str, Any], target: float = 1.03) -> str:
    """Markdown: per corpus and (sampler, sigma), the ratio to the reference against s at every length."""
    rows = gap_rows(results)
    if not rows:
        return ""
    ref, train_len = results["reference"], results["train_len"]
    lengths = sorted({r["length"] for r in rows})
    out = [f"Perplexity ratio of PLSH (and of truncated ALiBi at s samples' cost) to {ref} against s: "
           f"paired ratio over {len(rows[0]['seed_ratios'])} "
           f"training seed(s) {{95% CI over training seeds}}; below it, [95% CI over windows] and the worst "
           f"seed's own ratio. Target: <= {target:g} at every length, judged on the seed interval; the last "
           f"column says how many training seeds a ±{target - 1:.0%} interval would need at the observed "
           f"spread.\n"]
    for corpus, sampler, sigma in dict.fromkeys((r["corpus"], r["sampler"], r["sigma"]) for r in rows):
        sub = [r for r in rows if (r["corpus"], r["sampler"], r["sigma"]) == (corpus, sampler, sigma)]
        what = "truncated ALiBi at s samples' cost" if sampler == TRUNCATED else f"PLSH, sampler {sampler}"
        out.append(f"**{corpus}, {what}, sigma {'per head' if sigma == 'h' else 'constant'}**\n")
        out.append("| s | " + " | ".join(f"L={L} ({L / train_len:g}x)" for L in lengths)
                   + " | target | seeds needed |")
        out.append("|---|" + "---|" * len(lengths) + "---|---|")
        for s in sorted({r["s"] for r in sub}):
            cell = {r["length"]: r for r in sub if r["s"] == s}
            texts, verdicts, needed = [], [], []
            for L in lengths:
                r = cell.get(L)
                if r is None:
                    texts.append("–")
                    verdicts.append("unresolved")
                    continue
                lo, hi = r["ratio_ci"]
                slo, shi = r["seed_ci"]
                texts.append(f"{r['ratio']:.3f} {{{slo:.3f}, {shi:.3f}}}<br>[{lo:.3f}, {hi:.3f}] "
                             f"max {r['seed_max']:.3f}")
                verdicts.append(verdict(r["seed_ci"], target))
                needed.append(seeds_needed(r["seed_log_sd"], target))
            need = max((n for n in needed if n is not None), default=None)
            out.append(f"| {s} | " + " | ".join(texts) + f" | {_combined(verdicts)} | {need or '–'} |")
        out.append("")
    return "\n".join(out) + "\n"


def plot_gap(results: dict[str, Any], path: str | Path, target: float = 1.03) -> Path | None:
    """``gap.png``: ratio to the reference against s (log), one line per (sampler, sigma, length),
    error bars = the 95% interval over training seeds; 1 and the target as guides."""
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
            ci = [p["seed_ci"] for p in pts]
            bars = all(math.isfinite(v) for c in ci for v in c)  # one seed: no interval
            series.append(Series(f"{key[0]}, sigma {key[1]}, L={key[2]}", [p["s"] for p in pts],
                                 [p["ratio"] for p in pts], ylow=[c[0] for c in ci] if bars else None,
                                 yhigh=[c[1] for c in ci] if bars else None))
        span = [min(r["s"] for r in sub), max(r["s"] for r in sub)]
        series += [Series("ALiBi", span, [1.0, 1.0], style="k-"),
                   Series(f"target {target:g}", span, [target, target], style="--", kwargs={"color": "grey"})]
        panels.append((f"{corpus}: trained at L={results['train_len']}", series))
    return line_plot(path, panels, xlabel="hash samples s (training and evaluation)",
                     ylabel=f"perplexity / {results['reference']} (paired)", logx=True, logy=False)
