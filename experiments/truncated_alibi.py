"""Truncated ALiBi against positional LSH at equal cost: approximation error.

    python experiments/truncated_alibi.py --checkpoint runs/quality_gap/prose/alibi_h/seed0/final \
        --text data_cache/jargon_corpus/val.jsonl --out results/truncated_alibi

At ``s`` samples, positional LSH in one pass attends about ``sigma (ln s + 0.58)``
keys per query (its band); exact ALiBi truncated at ``w = ceil((ln s + 0.58) sigma)``
attends ``w`` (``experiments.approximation.equal_cost``).  For each (sigma, s) of the grid:

1. cost: the band measured with the project's hash (``PositionalLSH.block_bounds``,
   causal keys per query, the query included) for each sampler, against ``w`` and
   against the exact i.i.d. expectation;
2. ``||L* - M~||`` and ``||L* - L*_w||`` in max and spectral norm (the full symmetric
   matrices, n positions; the approximation tool's ``mask_error`` and
   ``truncated_mask_error``), PLSH over ``--seeds`` hashes;
3. the relative error ``||T* - T~||_F / ||T*||_F`` of causal attention outputs on the
   q/k/v of a trained exact-ALiBi checkpoint (the tool's ``output_error`` and
   ``truncated_output_error``), each head against its own trained sigma (the 4 heads
   of the tiny model have sigma = 4, 16, 64, 256: the grid), every layer.

Truncation is also measured at the band of each stratified sampler (whose band is
narrower than i.i.d.'s): the deterministic baseline at that sampler's own cost.

Writes results.json, table.md and max_norm.png / spectral_norm.png / output_error.png.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a clone without installing
import experiments  # noqa: E402,F401  registers the lab's samplers when this file runs as a script

IID = "iid"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="exact-ALiBi Hugging Face checkpoint (per-head sigma)")
    p.add_argument("--text", default=None, help="text for the checkpoint: a text file or a corpus .jsonl")
    p.add_argument("--sigma", default="4,16,64,256")
    p.add_argument("--samples", default="4,8,20,100")
    p.add_argument("--samplers", default="iid,stratified_ramp_alt", help="iid first, then any shipped sampler")
    p.add_argument("--n", type=int, default=2048, help="positions of the mask errors")
    p.add_argument("--seeds", type=int, default=5, help="hashes per point (mask and output errors)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens of the output errors")
    p.add_argument("--layers", default=None, help="checkpoint layers (default: all)")
    p.add_argument("--band-seeds", type=int, default=1000, help="hashes per point for the band")
    p.add_argument("--band-positions", type=int, default=64, help="query positions per hash, sigma apart")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sigmas = [float(x) for x in args.sigma.split(",")]
    samples = [int(x) for x in args.samples.split(",")]
    samplers = [x.strip() for x in args.samplers.split(",") if x.strip()]
    if samplers[0] != IID:
        p.error("--samplers must start with iid (the reference the equal-cost window stands for)")

    import torch

    torch.set_num_threads(1)
    t0 = time.time()
    results = {"command": _command(argv), "config": {**vars(args), "sigma": sigmas, "samples": samples,
                                                    "samplers": samplers}}
    results["band"] = measure_band(sigmas, samples, samplers, args.band_seeds, args.band_positions)
    print(f"[study] band: {time.time() - t0:.0f} s", flush=True)
    alt_windows = {(b["sigma"], b["s"], b["sampler"]): max(1, round(b["keys_mean"])) for b in results["band"]}
    results["mask"] = measure_masks(sigmas, samples, samplers, args.n, args.seeds, alt_windows)
    print(f"[study] masks: {time.time() - t0:.0f} s", flush=True)
    results["output"] = measure_outputs(args, sigmas, samples, samplers, alt_windows)
    print(f"[study] outputs: {time.time() - t0:.0f} s", flush=True)
    results["elapsed_s"] = round(time.time() - t0, 1)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table(results))
    plots(results, out)
    print(f"[study] done in {results['elapsed_s']:.0f} s; wrote {out}")
    return 0


def _command(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return "python experiments/truncated_alibi.py " + " ".join(shlex.quote(a) for a in args)


def _truncated_label(sampler: str | None) -> str:
    """Entry name: the rule's window, or the window of a sampler's measured band."""
    return "truncated" if sampler is None else f"truncated@{sampler}"


# ---------------------------------------------------------------------------
# Measurements.
# ---------------------------------------------------------------------------


def measure_band(sigmas, samples, samplers, seeds: int, num_positions: int) -> list[dict]:
    """Causal one-pass band per (sigma, s, sampler): mean over hashes of each hash's mean over
    ``num_positions`` queries ``ceil(sigma)`` apart; the spread is over hashes."""
    import torch

    from experiments.approximation.equal_cost import band_keys, equal_cost_window, iid_band_keys
    from plsh_dist.hashing import PositionalLSH

    rows = []
    for sigma in sigmas:
        positions = torch.arange(num_positions) * math.ceil(sigma)
        for s in samples:
            w = int(equal_cost_window(sigma, s))
            for sampler in samplers:
                per_seed = torch.stack([band_keys(PositionalLSH(sigma, s, seed, sampler), positions).mean()
                                        for seed in range(seeds)])
                rows.append({"sigma": sigma, "s": s, "sampler": sampler, "window": w, "seeds": seeds,
                             "keys_mean": float(per_seed.mean()), "keys_std": float(per_seed.std()),
                             "keys_stderr": float(per_seed.std()) / math.sqrt(seeds),
                             "iid_expected": iid_band_keys(sigma, s)})
    return rows


def measure_masks(sigmas, samples, samplers, n: int, seeds: int, alt_windows: dict) -> list[dict]:
    from experiments.approximation.approx_error import mask_error, truncated_mask_error

    rows = []
    for sigma in sigmas:
        for sampler in samplers:
            rows += mask_error(sigma, n, samples, seeds, sampler)
        rows += truncated_mask_error(sigma, n, samples)
        for sampler in samplers[1:]:
            windows = [alt_windows[(sigma, s, sampler)] for s in samples]
            rows += [{**r, "sampler": _truncated_label(sampler)}
                     for r in truncated_mask_error(sigma, n, samples, windows=windows)]
        print(f"[study] masks sigma={sigma:g}", flush=True)
    return rows


def measure_outputs(args, sigmas, samples, samplers, alt_windows: dict) -> list[dict]:
    """Per head h of the checkpoint (its trained sigma_h), the layers stacked as a batch:
    the hashes are drawn once for all layers, and each layer's error is kept."""
    import torch
    from transformers import AutoConfig

    import plsh_dist.models  # noqa: F401  registers the checkpoint's model type
    from experiments.approximation.approx_error import output_error, truncated_output_error
    from experiments.approximation.qkv_capture import checkpoint_qkv
    from plsh_dist.biases import head_scales

    hf = AutoConfig.from_pretrained(args.checkpoint)
    attn_cfg = hf.plsh_dist["attention"]
    if attn_cfg["bias"] != "alibi":
        raise ValueError(f"--checkpoint must be an exact-ALiBi model (bias 'alibi'), got {attn_cfg['bias']!r}")
    head_sigma, _ = head_scales(attn_cfg["sigma"], hf.num_attention_heads)
    head_sigma = [float(x) for x in torch.as_tensor(head_sigma).reshape(-1).expand(hf.num_attention_heads)]
    layers = ([int(x) for x in args.layers.split(",")] if args.layers else list(range(hf.num_hidden_layers)))
    qkv = checkpoint_qkv(args.checkpoint, args.seq_len, layers, args.text)
    q, k, v = (torch.cat([x[i] for _, x in qkv]) for i in range(3))  # (layers, T, H, D)
    groups = q.shape[2] // k.shape[2]
    rows = []
    for sigma in sigmas:
        if sigma not in head_sigma:
            raise ValueError(f"sigma {sigma:g} is no head's sigma in {args.checkpoint} ({head_sigma})")
        h = head_sigma.index(sigma)
        qh, kh, vh = q[:, :, h : h + 1], k[:, :, h // groups : h // groups + 1], v[:, :, h // groups : h // groups + 1]
        recs = []
        for sampler in samplers:
            recs += output_error(qh, kh, vh, sigma, samples, args.seeds, sampler)
        recs += truncated_output_error(qh, kh, vh, sigma, samples)
        for sampler in samplers[1:]:
            windows = [alt_windows[(sigma, s, sampler)] for s in samples]
            recs += [{**r, "sampler": _truncated_label(sampler)}
                     for r in truncated_output_error(qh, kh, vh, sigma, samples, windows=windows)]
        rows += [{"sigma": sigma, "head": h, "layers": layers, **r} for r in recs]
        print(f"[study] outputs sigma={sigma:g} (head {h})", flush=True)
    return rows


# ---------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------


def _entries(cfg: dict) -> list[str]:
    return [*cfg["samplers"], _truncated_label(None), *(_truncated_label(x) for x in cfg["samplers"][1:])]


def _find(rows: list[dict], sigma: float, s: int, sampler: str) -> dict:
    (row,) = [r for r in rows if r["sigma"] == sigma and r["s"] == s and r["sampler"] == sampler]
    return row


def _cell(row: dict, key: str, fmt: str) -> str:
    if row["seeds"] > 1:
        return f"{row[key + '_mean']:{fmt}} ± {row[key + '_std']:{fmt}}"
    return f"{row[key + '_mean']:{fmt}}"


def table(results: dict) -> str:
    cfg = results["config"]
    samplers, entries = cfg["samplers"], _entries(cfg)
    lines = ["# Truncated ALiBi against positional LSH at equal cost", "",
             f"    {results['command']}", "",
             f"({results['elapsed_s']:.0f} s.)  Equal cost: truncated ALiBi keeps the keys with |i - j| < w, "
             "w = ceil((ln s + 0.58) sigma); PLSH in one pass attends its band.  `truncated@X`: truncated at the "
             "window of sampler X's measured band (X's own cost).  ± is the standard deviation over hashes "
             "(PLSH; truncation is deterministic).", ""]

    best = samplers[-1]
    lines += [f"## Summary: PLSH's error over truncated ALiBi's, at equal cost (> 1: truncation is closer)", "",
              f"Means over hashes; `iid` against `truncated` (the rule's window, within 1% above to 9% below the "
              f"i.i.d. band), `{best}` against `truncated@{best}` (the window of its own measured band).", "",
              "| sigma | s | max: iid | max: " + best + " | spectral: iid | spectral: " + best
              + " | output: iid | output: " + best + " |", "|" + "---|" * 8]
    for sigma in cfg["sigma"]:
        for s in cfg["samples"]:
            cells = []
            for rows, key in ((results["mask"], "max"), (results["mask"], "spectral"),
                              (results["output"], "rel_fro")):
                for plsh, trunc in ((IID, _truncated_label(None)), (best, _truncated_label(best))):
                    ratio = _find(rows, sigma, s, plsh)[f"{key}_mean"] / _find(rows, sigma, s, trunc)[f"{key}_mean"]
                    cells.append(f"{ratio:.1f}x")
            lines.append(f"| {sigma:g} | {s} | " + " | ".join(cells) + " |")
    lines += [""]

    lines += ["## Cost: keys per causal query (the query included)", "",
              f"Band measured with `PositionalLSH.block_bounds`, mean over {cfg['band_seeds']} hashes "
              f"({cfg['band_positions']} queries each) ± standard error; i.i.d. expected: the exact "
              "expectation `1 + sum_d 1 - (1 - e^(-d/sigma))^s`.", "",
              "| sigma | s | window w | " + " | ".join(f"{x} band" for x in samplers)
              + " | i.i.d. expected | w / i.i.d. expected |",
              "|" + "---|" * (5 + len(samplers))]
    for sigma in cfg["sigma"]:
        for s in cfg["samples"]:
            rows = [_find(results["band"], sigma, s, x) for x in samplers]
            cells = [f"{r['keys_mean']:.1f} ± {r['keys_stderr']:.1f}" for r in rows]
            exp = rows[0]["iid_expected"]
            lines.append(f"| {sigma:g} | {s} | {rows[0]['window']} | " + " | ".join(cells)
                         + f" | {exp:.1f} | {rows[0]['window'] / exp:.3f} |")

    for key, title, fmt in (("max", "Max-norm error max |L* - W| (symmetric, n = {n})", ".4f"),
                            ("spectral", "Spectral error ||L* - W||_2 (symmetric, n = {n})", ".3f")):
        lines += ["", f"## {title.format(n=cfg['n'])}", "",
                  "| sigma | s | " + " | ".join(entries) + " |", "|" + "---|" * (2 + len(entries))]
        for sigma in cfg["sigma"]:
            for s in cfg["samples"]:
                cells = [_cell(_find(results["mask"], sigma, s, e), key, fmt) for e in entries]
                lines.append(f"| {sigma:g} | {s} | " + " | ".join(cells) + " |")

    layers = results["output"][0]["layers"]
    lines += ["", f"## Attention-output error ||T* - T~||_F / ||T*||_F (causal, T = {cfg['seq_len']}, trained q/k/v)", "",
              f"Checkpoint `{cfg['checkpoint']}`, the head whose trained sigma is the row's; all layers "
              f"{layers} together (per layer in results.json).", "",
              "| sigma | s | " + " | ".join(entries) + " |", "|" + "---|" * (2 + len(entries))]
    for sigma in cfg["sigma"]:
        for s in cfg["samples"]:
            cells = [_cell(_find(results["output"], sigma, s, e), "rel_fro", ".4f") for e in entries]
            lines.append(f"| {sigma:g} | {s} | " + " | ".join(cells) + " |")

    lines += ["", "### Per layer (mean over hashes)", "",
              "| sigma | s | layer | " + " | ".join(entries) + " |", "|" + "---|" * (3 + len(entries))]
    for sigma in cfg["sigma"]:
        for s in cfg["samples"]:
            rows = [_find(results["output"], sigma, s, e) for e in entries]
            for i, layer in enumerate(layers):
                lines.append(f"| {sigma:g} | {s} | {layer} | "
                             + " | ".join(f"{r['rel_fro_batch_mean'][i]:.4f}" for r in rows) + " |")
    return "\n".join(lines) + "\n"


def plots(results: dict, out: Path) -> None:
    from plsh_dist.eval.plots import Series, line_plot

    cfg = results["config"]
    styles = {"iid": "-o", "truncated": "-s"}
    for name, rows, key, ylabel in (
        ("max_norm.png", results["mask"], "max", "max |L* - W|"),
        ("spectral_norm.png", results["mask"], "spectral", "||L* - W||_2"),
        ("output_error.png", results["output"], "rel_fro", "||T* - T~||_F / ||T*||_F (trained q/k/v)"),
    ):
        panels = []
        for sigma in cfg["sigma"]:
            series = []
            for e in _entries(cfg):
                pts = [_find(rows, sigma, s, e) for s in cfg["samples"]]
                series.append(Series(e, cfg["samples"], [r[f"{key}_mean"] for r in pts],
                                     [r[f"{key}_std"] for r in pts], style=styles.get(e, "--^")))
            panels.append((f"sigma = {sigma:g}", series))
        line_plot(out / name, panels, "samples s (truncation: w = ceil((ln s + 0.58) sigma))", ylabel)


if __name__ == "__main__":
    raise SystemExit(main())
