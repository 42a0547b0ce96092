"""The approximation-error study: run every measurement, write results.json, table.md, PNGs.

``python -m experiments.approximation`` (``__main__.py``) is the command line; this module is the run.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from experiments.approximation.approx_error import (
    TRUNCATED,
    fit_loglog_slope,
    mask_error,
    max_block_size,
    output_error,
    samples_to_match,
    truncated_mask_error,
    truncated_output_error,
)
from plsh_dist.eval.plots import Series, line_plot
from plsh_dist.hashing import get_sampler

#: The default samplers, and the pair whose sample counts are matched (``match_at``).
SAMPLERS = ("iid", "stratified")


@dataclass
class ApproxErrorConfig:
    """What to measure."""

    sigma: list[float] = field(default_factory=lambda: [4.0, 16.0, 64.0])
    """Kernel scales (ALiBi slope 1 / sigma), one hash shared by all heads."""
    seq_len: int = 1024
    """n: positions for ||L* - M~|| and tokens for ||T* - T~||."""
    samples: list[int] = field(default_factory=lambda: [2**i for i in range(11)])
    """Increasing sample counts s."""
    seeds: int = 5
    """Independent hashes per point for the mask error (mean and std)."""
    samplers: list[str] = field(default_factory=lambda: list(SAMPLERS))
    """Samplers of :class:`plsh_dist.hashing.PositionalLSH`: 'iid' (the paper's), 'stratified'
    and the stratified ramps (ours, lower variance)."""
    truncated: bool = False
    """Also measure the deterministic baseline at each s's cost: exact ALiBi truncated at
    ``w = ceil((ln s + 0.58) sigma)`` (records and columns ``"truncated"``)."""
    output_seeds: int = 2
    """Hashes per point for the output error (dense attention is the costly part)."""
    block_seq_lens: list[int] = field(default_factory=lambda: [256, 1024, 4096, 16384])
    """n values for the largest-block curve."""
    heads: int = 4
    """Heads of the random q/k/v."""
    head_dim: int = 32
    """Head dim of the random q/k/v."""
    checkpoint: str | None = None
    """Optional Hugging Face model directory whose layers provide q/k/v."""
    layers: list[int] | None = None
    """Checkpoint layers to capture (default: first, middle, last)."""
    match_at: int = 64
    """s of the i.i.d. error that the stratified sampler must reach (the design target)."""

    def __post_init__(self):
        if not self.sigma or any(not (s > 0 and math.isfinite(s)) for s in self.sigma):
            raise ValueError(f"sigma must be positive finite numbers, got {self.sigma}")
        if self.seq_len < 3:
            raise ValueError(f"seq_len must be >= 3 (log log n > 0), got {self.seq_len}")
        if not self.samples or self.samples != sorted(set(self.samples)) or self.samples[0] < 1:
            raise ValueError(f"samples must be strictly increasing ints >= 1, got {self.samples}; "
                             "e.g. --samples 1,2,4,...,1024")
        if self.seeds < 1 or self.output_seeds < 1:
            raise ValueError(f"seeds and output_seeds must be >= 1, got {self.seeds}, {self.output_seeds}")
        if not self.samplers:
            raise ValueError("samplers must not be empty; e.g. --samplers iid,stratified")
        for sampler in self.samplers:
            get_sampler(sampler, "samplers")
        if any(n < 3 for n in self.block_seq_lens):
            raise ValueError(f"block_seq_lens must be >= 3, got {self.block_seq_lens}")


def parse_int_list(text: str) -> list[int]:
    """'1,2,4,...,1024' -> [1, 2, 4, ..., 1024] (a '...' continues the ratio of the two before it)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    out: list[int] = []
    for i, p in enumerate(parts):
        if p == "...":
            if len(out) < 2 or i + 1 >= len(parts):
                raise ValueError(f"'...' needs two numbers before it and one after: {text!r}")
            ratio, stop = out[-1] / out[-2], int(parts[i + 1])
            if ratio <= 1:
                raise ValueError(f"'...' continues a growing sequence; got ratio {ratio} in {text!r}")
            while out[-1] * ratio < stop:
                out.append(int(round(out[-1] * ratio)))
        else:
            out.append(int(p))
    return out


def num_steps(cfg: ApproxErrorConfig, num_extra_qkv: int = 0) -> int:
    """Progress ticks of :func:`run_study` (for a progress bar's total)."""
    entries = len(cfg.samplers) + int(cfg.truncated)
    return len(cfg.sigma) * (entries * (2 + num_extra_qkv) + 1)


def _entries(cfg: dict) -> list[str]:
    """The samplers, then ``"truncated"`` when measured (``cfg``: a saved config): the columns."""
    return [*cfg["samplers"], *([TRUNCATED] if cfg.get("truncated", False) else [])]


def run_study(cfg: ApproxErrorConfig, extra_qkv: list[tuple[str, tuple]] = (),
              progress: Callable[[str], None] | None = None) -> dict:
    """All measurements of ``cfg``.

    The output error is measured on random q/k/v (B=1, T=seq_len, ``cfg.heads``,
    ``cfg.head_dim``, standard normal) and on each ``(label, (q, k, v))`` of
    ``extra_qkv`` (e.g. from :func:`experiments.approximation.qkv_capture.capture_qkv`).
    """
    tick = progress or (lambda _msg: None)
    gen = torch.Generator().manual_seed(0)
    shape = (1, cfg.seq_len, cfg.heads, cfg.head_dim)
    qkv = [("random", tuple(torch.randn(shape, generator=gen) for _ in range(3))), *extra_qkv]
    results: dict = {"config": asdict(cfg), "mask": [], "blocks": [], "output": []}
    for sigma in cfg.sigma:
        for sampler in cfg.samplers:
            results["mask"] += mask_error(sigma, cfg.seq_len, cfg.samples, cfg.seeds, sampler)
            tick(f"mask sigma={sigma:g} {sampler}")
        if cfg.truncated:
            results["mask"] += truncated_mask_error(sigma, cfg.seq_len, cfg.samples)
            tick(f"mask sigma={sigma:g} {TRUNCATED}")
    for sigma in cfg.sigma:
        for n in cfg.block_seq_lens:
            for s in sorted({1, cfg.samples[-1]}):
                results["blocks"].append(max_block_size(sigma, n, cfg.seeds, num_samples=s))
        tick(f"blocks sigma={sigma:g}")
    for label, (q, k, v) in qkv:
        for sigma in cfg.sigma:
            for sampler in cfg.samplers:
                for rec in output_error(q, k, v, sigma, cfg.samples, cfg.output_seeds, sampler):
                    results["output"].append({"source": label, "sigma": sigma, **rec})
                tick(f"output {label} sigma={sigma:g} {sampler}")
            if cfg.truncated:
                for rec in truncated_output_error(q, k, v, sigma, cfg.samples):
                    results["output"].append({"source": label, "sigma": sigma, **rec})
                tick(f"output {label} sigma={sigma:g} {TRUNCATED}")
    results["summary"] = _summarise(cfg, results)
    return results


def _curve(results: dict, sigma: float, sampler: str) -> list[dict]:
    return [r for r in results["mask"] if r["sigma"] == sigma and r["sampler"] == sampler]


def _summarise(cfg: ApproxErrorConfig, results: dict) -> dict:
    out: dict = {"per_sigma": []}
    for sigma in cfg.sigma:
        row: dict = {"sigma": sigma}
        for sampler in cfg.samplers:
            curve = _curve(results, sigma, sampler)
            # Fit where the max norm is off its small-s plateau near 1 (s >= 16).
            tail = [r for r in curve if r["s"] >= 16] or curve
            if len(tail) >= 2:
                row[f"{sampler}_max_slope"] = fit_loglog_slope([r["s"] for r in tail], [r["max_mean"] for r in tail])
                row[f"{sampler}_spectral_slope"] = fit_loglog_slope(
                    [r["s"] for r in tail], [r["spectral_mean"] for r in tail])
            row[f"{sampler}_bound_holds"] = all(
                max(r["spectral_values"]) <= r["bound"] and max(r["max_values"]) <= r["bound"] for r in curve)
        if set(SAMPLERS) <= set(cfg.samplers):
            ref = [r for r in _curve(results, sigma, "iid") if r["s"] == cfg.match_at]
            if ref:
                level = ref[0]["max_mean"]
                row["iid_max_at_match"] = level
                row["stratified_samples_to_match"] = samples_to_match(_curve(results, sigma, "stratified"), level)
        out["per_sigma"].append(row)
    return out


def write_table(results: dict, path: Path) -> None:
    """Markdown tables of every measurement."""
    cfg = results["config"]
    lines = [f"# Approximation error of positional LSH (n = {cfg['seq_len']}, {cfg['seeds']} seeds)", ""]
    lines += ["## ||L* - M~|| versus s (mean +- std over seeds)", ""]
    samplers, entries = cfg["samplers"], _entries(cfg)
    head = "| sigma | s | " + " | ".join(f"{s} max | {s} spectral" for s in entries) + " | paper bound |"
    lines += [head, "|" + "---|" * (3 + 2 * len(entries))]
    for sigma in cfg["sigma"]:
        for i, s in enumerate(cfg["samples"]):
            cells = []
            for sampler in entries:
                r = _curve(results, sigma, sampler)[i]
                cells += [f"{r['max_mean']:.4f} +- {r['max_std']:.4f}", f"{r['spectral_mean']:.3f} +- {r['spectral_std']:.3f}"]
            bound = _curve(results, sigma, samplers[0])[i]["bound"]
            lines.append(f"| {sigma:g} | {s} | " + " | ".join(cells) + f" | {bound:.3f} |")
    lines += ["", "## Fitted slopes (s >= 16), bound, stratified vs iid", ""]
    lines += ["| sigma | " + " | ".join(f"{s} max slope | {s} spectral slope | {s} bound holds" for s in samplers)
              + f" | iid max at s={cfg['match_at']} | stratified s to match |",
              "|" + "---|" * (3 + 3 * len(samplers))]
    for row in results["summary"]["per_sigma"]:
        cells = []
        for sampler in samplers:
            cells += [f"{row.get(f'{sampler}_max_slope', float('nan')):.3f}",
                      f"{row.get(f'{sampler}_spectral_slope', float('nan')):.3f}", str(row[f"{sampler}_bound_holds"])]
        match = row.get("stratified_samples_to_match")
        lines.append(f"| {row['sigma']:g} | " + " | ".join(cells)
                     + f" | {row.get('iid_max_at_match', float('nan')):.4f} | {'-' if match is None else f'{match:.1f}'} |")
    lines += ["", "## Largest block (i.i.d.) versus sigma log log n", "",
              "| sigma | n | samples | largest (mean) | largest (max) | mean block | sigma log log n | ratio |",
              "|---|---|---|---|---|---|---|---|"]
    for b in results["blocks"]:
        lines.append(f"| {b['sigma']:g} | {b['n']} | {b['num_samples']} | {b['largest_mean']:.1f} | {b['largest_max']} "
                     f"| {b['mean_block']:.1f} | {b['sigma_loglogn']:.1f} | {b['ratio_mean']:.2f} |")
    lines += ["", "## ||T* - T~|| of attention outputs", "",
              "| source | sigma | sampler | s | relative Frobenius | max abs |", "|---|---|---|---|---|---|"]
    for r in results["output"]:
        lines.append(f"| {r['source']} | {r['sigma']:g} | {r['sampler']} | {r['s']} "
                     f"| {r['rel_fro_mean']:.4f} +- {r['rel_fro_std']:.4f} | {r['max_mean']:.4f} |")
    path.write_text("\n".join(lines) + "\n")


def write_plots(results: dict, out: Path) -> list[Path]:
    """error_vs_s.png, blocks.png, iid_vs_stratified.png, output_error.png."""
    cfg = results["config"]
    paths = []
    panels = []
    for sigma in cfg["sigma"]:
        series = []
        for sampler in _entries(cfg):
            c = _curve(results, sigma, sampler)
            xs = [r["s"] for r in c]
            series.append(Series(f"{sampler} spectral", xs, [r["spectral_mean"] for r in c], [r["spectral_std"] for r in c]))
            series.append(Series(f"{sampler} max", xs, [r["max_mean"] for r in c], [r["max_std"] for r in c]))
        c = _curve(results, sigma, cfg["samplers"][0])
        xs = [r["s"] for r in c]
        series.append(Series("paper bound", xs, [r["bound"] for r in c], style="k--"))
        anchor = c[-1]["spectral_mean"] * math.sqrt(xs[-1])
        series.append(Series("1/sqrt(s) guide", xs, [anchor / math.sqrt(x) for x in xs], style=":", kwargs={"color": "gray"}))
        panels.append((f"sigma = {sigma:g}, n = {cfg['seq_len']}", series))
    paths.append(line_plot(out / "error_vs_s.png", panels, "samples s", "||L* - M~||"))

    series = []
    for s in sorted({b["num_samples"] for b in results["blocks"]}):
        pts = sorted((b["sigma_loglogn"], b["largest_mean"], b["largest_std"]) for b in results["blocks"] if b["num_samples"] == s)
        series.append(Series(f"largest block, {s} sample(s)", [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts], style="o"))
    lo = min(b["sigma_loglogn"] for b in results["blocks"])
    hi = max(b["sigma_loglogn"] for b in results["blocks"])
    series.append(Series("y = sigma log log n", [lo, hi], [lo, hi], style="k--"))
    paths.append(line_plot(out / "blocks.png", [("largest block vs sigma log log n", series)],
                           "sigma * log(log(n))", "largest block (positions)"))

    if set(SAMPLERS) <= set(cfg["samplers"]):
        panels = []
        for sigma in cfg["sigma"]:
            series = []
            for sampler in SAMPLERS:
                c = _curve(results, sigma, sampler)
                series.append(Series(sampler, [r["s"] for r in c], [r["max_mean"] for r in c], [r["max_std"] for r in c]))
            ref = [r for r in _curve(results, sigma, "iid") if r["s"] == cfg["match_at"]]
            if ref:
                xs = [r["s"] for r in c]
                series.append(Series(f"iid at s={cfg['match_at']}", [xs[0], xs[-1]], [ref[0]["max_mean"]] * 2, style="k:"))
            panels.append((f"max norm, sigma = {sigma:g}", series))
        paths.append(line_plot(out / "iid_vs_stratified.png", panels, "samples s", "max |L* - M~|"))

    panels = []
    for source in dict.fromkeys(r["source"] for r in results["output"]):
        series = []
        for sigma in cfg["sigma"]:
            for sampler in _entries(cfg):
                c = [r for r in results["output"] if r["source"] == source and r["sigma"] == sigma and r["sampler"] == sampler]
                series.append(Series(f"sigma {sigma:g} {sampler}", [r["s"] for r in c], [r["rel_fro_mean"] for r in c],
                                     style="-o" if sampler == "iid" else "--s"))
        panels.append((f"q/k/v: {source}", series))
    if panels:
        paths.append(line_plot(out / "output_error.png", panels, "samples s", "||T* - T~||_F / ||T*||_F"))
    return paths


def summary_lines(results: dict) -> list[str]:
    """Human summary printed at the end of a run."""
    cfg = results["config"]
    lines = []
    for row in results["summary"]["per_sigma"]:
        parts = [f"sigma={row['sigma']:g}:"]
        for sampler in cfg["samplers"]:
            if f"{sampler}_max_slope" in row:
                parts.append(f"{sampler} max-norm slope {row[f'{sampler}_max_slope']:.3f}"
                             f" (spectral {row[f'{sampler}_spectral_slope']:.3f}),"
                             f" bound holds={row[f'{sampler}_bound_holds']};")
        if "stratified_samples_to_match" in row:
            m = row["stratified_samples_to_match"]
            parts.append(f"stratified reaches iid s={cfg['match_at']} max error {row['iid_max_at_match']:.4f} at "
                         + ("no measured s" if m is None else f"s~{m:.1f} ({cfg['match_at'] / m:.1f}x fewer)"))
        lines.append(" ".join(parts))
    big = max(results["blocks"], key=lambda b: b["ratio_mean"]) if results["blocks"] else None
    if big:
        lines.append(f"largest block / (sigma log log n): up to {big['ratio_mean']:.2f} "
                     f"(sigma={big['sigma']:g}, n={big['n']}, {big['num_samples']} samples)")
    return lines


def save(results: dict, out: Path) -> list[Path]:
    """results.json, table.md and the PNGs under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_table(results, out / "table.md")
    return [out / "results.json", out / "table.md", *write_plots(results, out)]
