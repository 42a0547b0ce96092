"""How many fewer samples does a sampler need than i.i.d. for the same max-norm error?

For each sigma: the i.i.d. estimator's mean max-norm error ``||L* - M~||_max``
at ``s = match_at`` (64: the issue's target) over ``seeds`` hashes, then each
sampler's mean error over a ladder of ``s``; the ``s`` at which a sampler's
curve first reaches the i.i.d. level (log-log interpolation,
:func:`plsh_dist.eval.approx_error.samples_to_match`) gives the ratio
``match_at / s``.  ``launchers/sampler_ratio.py`` runs it and writes the table.
"""

from __future__ import annotations

import time
from typing import Sequence

from plsh_dist.eval.approx_error import mask_error, samples_to_match

__all__ = ["sampler_ratios", "format_ratios"]


def sampler_ratios(sigmas: Sequence[float], n: int, samplers: Sequence[str], ladder: Sequence[int],
                   seeds: int, match_at: int = 64) -> dict:
    """``{"rows": [{sigma, iid_level, <sampler>_s, <sampler>_ratio, <sampler>_curve}], ...}``."""
    rows = []
    t0 = time.time()
    for sigma in sigmas:
        level = mask_error(sigma, n, [match_at], seeds, "iid", spectral=False)[0]["max_mean"]
        row = {"sigma": float(sigma), "iid_s": match_at, "iid_level": level}
        for sampler in samplers:
            curve = mask_error(sigma, n, ladder, seeds, sampler, spectral=False)
            s_star = samples_to_match(curve, level)
            row[f"{sampler}_s"] = s_star
            row[f"{sampler}_ratio"] = match_at / s_star if s_star else None
            row[f"{sampler}_curve"] = [{"s": r["s"], "max_mean": r["max_mean"], "max_std": r["max_std"]} for r in curve]
        rows.append(row)
    return {"n": n, "seeds": seeds, "match_at": match_at, "ladder": list(ladder), "samplers": list(samplers),
            "rows": rows, "wall_s": round(time.time() - t0, 1)}


def format_ratios(res: dict) -> str:
    """Markdown: per sigma, the i.i.d. level and each sampler's s and ratio."""
    samplers = res["samplers"]
    out = [f"max-norm error of M~ at n = {res['n']}, mean over {res['seeds']} seeds; "
           f"s needed to reach i.i.d.'s error at s = {res['match_at']} (ratio = {res['match_at']} / s)\n",
           "| sigma | iid max error at s = %d | " % res["match_at"] + " | ".join(samplers) + " |",
           "|---|---|" + "---|" * len(samplers)]
    for r in res["rows"]:
        cells = []
        for name in samplers:
            s = r[f"{name}_s"]
            cells.append(f"{s:.1f} ({r[f'{name}_ratio']:.2f}x fewer)" if s else "not reached")
        out.append(f"| {r['sigma']:g} | {r['iid_level']:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
