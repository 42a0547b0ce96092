"""Length extrapolation: the same weights under several attention modes and context lengths.

    settings = EvalSettings(lengths=[256, 512, 1024], modes="plsh:s=4,alibi,none")
    results = evaluate_checkpoint("runs/quickstart", settings, out_dir="runs/quickstart/extrapolation")
    print(format_table(results))

Every (mode, length, scoring) scores the same windows (``scoring.py``); PLSH modes run under several
hash seeds (mean and sample std), the rest once; rows keep their per-window losses for confidence
intervals and paired differences (``paired_differences``). Batch 1, no grad, chunked ALiBi and LM
head; with ``sp_group`` each rank feeds its chunk of every window. Seeds, uncertainty, memory,
sequence parallelism and the outputs: docs/evaluation.md, "How a checkpoint is evaluated".
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from plsh_dist.checkpoint.loading import LoadedCheckpoint, load_model
from plsh_dist.data.packing import document_cu_seqlens
from plsh_dist.distributed.sp_chunks import sp_bounds
from plsh_dist.eval.eval_data import load_eval_tokens
from plsh_dist.eval.mode_specs import attention_for
from plsh_dist.eval.scoring import (
    TokenSums,
    mean_ci,
    metrics_of,
    paired_ci,
    plan_windows,
    score_hidden,
    targets_digest,
    window_tokens,
)
from plsh_dist.eval.settings import EvalSettings
from plsh_dist.models import AttentionRuntime, set_attention_mode
from plsh_dist.models.parallelize import apply_sequence_parallel
from plsh_dist.progress import progress_bar

METRICS = ("loss", "perplexity", "bits_per_token", "accuracy")


@torch.no_grad()
def _score_window(model, toks: torch.Tensor, score_from: int, sp_group, eos_id: int | None = None) -> TokenSums:
    """Sums of one window (toks (L + 1,)), this rank's chunk only under SP. ``eos_id``:
    mask attention by document (a document ends with its EOS; the whole window's layout,
    as in training's ``[data].document_masking``)."""
    L = toks.numel() - 1
    inputs, labels = toks[:-1], toks[1:]  # shift on the whole window, then cut (as in training)
    lo, hi = 0, L
    if sp_group is not None:
        lo, hi = sp_bounds(L, dist.get_rank(sp_group), dist.get_world_size(sp_group), name="context length")
    pos = torch.arange(lo, hi)
    packed = {}
    if eos_id is not None:
        cu = document_cu_seqlens(inputs[None].numpy(), eos_id)
        packed = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    hidden = model.model(input_ids=inputs[None, lo:hi], position_ids=pos[None], **packed).last_hidden_state[0]
    keep = pos >= score_from
    return score_hidden(hidden, model.lm_head, labels[lo:hi], keep)


def _all_reduce_windows(per_window: list[TokenSums], sp_group) -> list[TokenSums]:
    """Every window's sums over the SP group, in one all-reduce of a (W, 3) tensor."""
    if sp_group is None:
        return per_window
    t = torch.stack([w.as_tensor() for w in per_window])
    dist.all_reduce(t, group=sp_group)
    return [TokenSums.from_tensor(row) for row in t]


def _uncertainty(window_loss: list[float], ci: dict[str, Any]) -> dict[str, Any]:
    """Row fields of the confidence interval over windows of the mean loss."""
    c = mean_ci(window_loss, **ci)
    return {"loss_se": c["se"], "loss_ci": [c["low"], c["high"]],
            "perplexity_ci": [math.exp(min(c["low"], 700.0)), math.exp(min(c["high"], 700.0))]
            if c["n"] > 1 else [math.nan, math.nan],
            "ci": {"method": c["method"], "level": c["level"], "windows": c["n"],
                   **({"resamples": ci["resamples"]} if c["method"] == "bootstrap" else {})}}


def _summary(per_seed: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in METRICS:
        vals = [r[m] for r in per_seed]
        out[f"{m}_mean"] = statistics.fmean(vals)
        out[f"{m}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return out


def evaluate_model(model, trained_attention, tokens: np.ndarray, settings: EvalSettings, *, sp_group=None,
                   eos_id: int | None = None) -> list[dict[str, Any]]:
    """Rows of results, one per (mode, scoring, length); see the module doc.

    Args:
        model: transformers causal LM with our attention (``load_model``).
        trained_attention: its training ``AttentionConfig`` (modes override it).
        tokens: (N,) evaluation token stream.
        settings: lengths, modes, seeds, scoring, confidence interval (``EvalSettings``;
            its ``data``, ``split`` and ``reference`` are ``evaluate_checkpoint``'s).
        sp_group: score every window over this sequence-parallel group (module doc).
        eos_id: the tokenizer's EOS id; needed with ``settings.document_masking``
            (a token then attends only within its document, which ends with EOS).
    Raises ValueError before any work if a length cannot be filled.
    """
    st = settings
    if st.document_masking and eos_id is None:
        raise ValueError("settings.document_masking needs the tokenizer's eos_id (evaluate_model(..., eos_id=...))")
    document_eos = eos_id if st.document_masking else None
    ci_args = st.ci_args
    plans = {}
    for scoring in st.scorings:
        usable = [L for L in st.lengths if not (scoring == "last" and (st.last_tokens is None or st.last_tokens > L))]
        align_to = max(usable) if (st.align and scoring == "last" and usable) else None
        for L in usable:  # the last-K scoring exists only for windows of at least K tokens
            plans[scoring, L] = plan_windows(len(tokens), L, scoring, st.last_tokens, st.max_windows,
                                             align_to=align_to)
    if not plans:
        raise ValueError(f"nothing to evaluate: scorings {list(st.scorings)} with lengths {st.lengths} "
                         f"and last_tokens={st.last_tokens}")
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    seeds = st.seeds
    total = sum(len(w) * (len(seeds) if m.stochastic else 1) for m in st.modes for w in plans.values())
    bar = None
    if st.progress and rank0:  # a bar on a terminal, lines every 30 s in a log (plsh_dist/progress.py)
        bar = progress_bar(total, desc="extrapolation", unit="window")
    rows = []
    was_training = model.training
    model.eval()
    apply_sequence_parallel(model, sp_group)  # once: every mode below attends over the SP group
    try:
        for mode in st.modes:
            attn = attention_for(mode, trained_attention)
            for (scoring, L), windows in plans.items():
                per_seed, seed_window_loss = [], []
                t0 = time.time()
                for seed in (seeds if mode.stochastic else seeds[:1]):
                    runtime = AttentionRuntime(run_seed=int(seed))
                    set_attention_mode(model, attn, runtime)
                    per_window = []
                    for i, w in enumerate(windows):
                        with runtime.at(i):  # fresh, reproducible masks per window
                            per_window.append(_score_window(model, window_tokens(tokens, w), w.score_from,
                                                             sp_group, document_eos))
                        if bar is not None:
                            bar.set_postfix_str(f"{mode.name} L={L} {scoring}")
                            bar.update(1)
                    per_window = _all_reduce_windows(per_window, sp_group)
                    sums = TokenSums()
                    for ws in per_window:
                        sums.add(ws)
                    per_seed.append({"seed": int(seed), **metrics_of(sums)})
                    seed_window_loss.append([ws.loss_sum / ws.count for ws in per_window])
                window_loss = np.mean(np.asarray(seed_window_loss, dtype=np.float64), axis=0).tolist()
                rows.append({
                    "mode": mode.name, "bias": mode.bias, "length": L, "scoring": scoring,
                    "scored_per_window": windows[0].scored, "windows": len(windows),
                    "tokens": per_seed[0]["tokens"], "seeds": [r["seed"] for r in per_seed],
                    **_summary(per_seed), **_uncertainty(window_loss, ci_args),
                    "aligned": st.align and scoring == "last", "targets": targets_digest(tokens, windows),
                    "window_loss": window_loss, "per_seed": per_seed, "seconds": round(time.time() - t0, 2),
                    "attention": attn.to_dict(),
                })
    finally:
        if bar is not None:
            bar.close()
        set_attention_mode(model, trained_attention)
        model.train(was_training)
    return rows


def evaluate_checkpoint(checkpoint: str | Path, settings: EvalSettings, out_dir: str | Path | None = None, *,
                        tokenizer: str | Path | None = None, sp_group=None) -> dict[str, Any]:
    """Load ``checkpoint``, evaluate it under ``settings``, write outputs to ``out_dir``
    (rank 0) and return the results.

    The returned dict is what ``results.json`` holds: ``{"checkpoint", "data",
    "trained", "rows", ...}``; with ``settings.reference`` also ``"paired"``
    (:func:`paired_differences`). ``tokenizer``: a ``.model`` file (default the
    checkpoint's own).
    """
    t0 = time.time()
    st = settings
    ck: LoadedCheckpoint = load_model(checkpoint, tokenizer=tokenizer)
    tokens, data_desc = load_eval_tokens(ck, st.data, split=st.split)
    rows = evaluate_model(ck.model, ck.trained_attention, tokens, st, sp_group=sp_group, eos_id=ck.tokenizer.eos_id)
    results = {
        "checkpoint": str(ck.path),
        "data": data_desc,
        "data_tokens": int(len(tokens)),
        "trained": {"seq_len": ck.run_config.data.seq_len if ck.run_config_file else None,  # None: not recorded
                    "attention": ck.trained_attention.to_dict(),
                    "model": ck.model_cfg.to_dict()},
        "lengths": list(st.lengths),
        "document_masking": bool(st.document_masking),
        "modes": [m.name for m in st.modes],
        "seeds": list(st.seeds),
        "scorings": list(st.scorings),
        "last_tokens": st.last_tokens,
        "max_windows": st.max_windows,
        "aligned": st.align,
        "ci": {"method": st.ci, "level": st.ci_level,
               **({"resamples": st.bootstrap_resamples} if st.ci == "bootstrap" else {})},
        "sp_size": dist.get_world_size(sp_group) if sp_group is not None else 1,
        "rows": rows,
        "wall_s": round(time.time() - t0, 1),
    }
    if st.reference is not None:
        results["paired"] = paired_differences(rows, st.reference, **st.ci_args)
    if out_dir is not None and (not dist.is_initialized() or dist.get_rank() == 0):
        write_outputs(results, out_dir)
    return results


def paired_differences(rows: list[dict[str, Any]], reference: str, key: str = "mode", **ci) -> list[dict[str, Any]]:
    """Per (scoring, length): mean loss of each other row minus ``reference``'s, with a
    paired confidence interval over their common windows (``scoring.paired_ci``),
    and the perplexity ratio ``exp(difference)`` with its bounds.

    Only rows that score the same target tokens (equal ``targets`` digests) are
    paired; ``key`` names the row field that identifies a mode (``"mode"``).
    """
    out = []
    ref = {(r["scoring"], r["length"]): r for r in rows if r[key] == reference}
    for r in rows:
        base = ref.get((r["scoring"], r["length"]))
        if r[key] == reference or base is None or r.get("targets") != base.get("targets"):
            continue
        c = paired_ci(r["window_loss"], base["window_loss"], **ci)
        out.append({key: r[key], "reference": reference, "scoring": r["scoring"], "length": r["length"],
                    "loss_diff": c["mean"], "loss_diff_ci": [c["low"], c["high"]],
                    "ppl_ratio": math.exp(c["mean"]), "ppl_ratio_ci": [math.exp(c["low"]), math.exp(c["high"])]
                    if c["n"] > 1 else [math.nan, math.nan], "windows": c["n"]})
    return out


def _fmt(row: dict, metric: str, digits: int, with_ci: bool = False) -> str:
    mean, std = row[f"{metric}_mean"], row[f"{metric}_std"]
    text = f"{mean:.{digits}f} ± {std:.{digits}f}" if len(row["seeds"]) > 1 else f"{mean:.{digits}f}"
    bounds = row.get(f"{metric}_ci")
    if with_ci and bounds and all(math.isfinite(b) for b in bounds):
        text += f" [{bounds[0]:.{digits}f}, {bounds[1]:.{digits}f}]"
    return text


def _ci_words(rows: list[dict[str, Any]]) -> str:
    c = next((r["ci"] for r in rows if "ci" in r), None)
    if c is None:
        return ""
    how = "t x standard error" if c["method"] == "se" else f"bootstrap, {c.get('resamples')} resamples"
    return f"; [{c['level']:.0%} CI over windows, {how}]"


def format_table(results: dict[str, Any] | list[dict[str, Any]], metric: str = "perplexity") -> str:
    """Markdown: one table per scoring, rows = modes, columns = lengths, cells =
    ``metric`` (mean ± std over seeds for PLSH); then a long table with every metric."""
    rows = results["rows"] if isinstance(results, dict) else results
    out = []
    for scoring in dict.fromkeys(r["scoring"] for r in rows):
        sub = [r for r in rows if r["scoring"] == scoring]
        lengths = sorted({r["length"] for r in sub})
        modes = list(dict.fromkeys(r["mode"] for r in sub))
        cell = {(r["mode"], r["length"]): r for r in sub}
        what = "all tokens of each window" if scoring == "whole" else \
            f"last {sub[0]['scored_per_window']} tokens of overlapping windows"
        if scoring == "last" and all(r.get("aligned") for r in sub):
            what += ", the same target tokens at every length"
        out.append(f"**{metric}** ({what}; mean ± std over hash seeds for PLSH{_ci_words(sub)})\n")
        out.append("| mode | " + " | ".join(f"L={L}" for L in lengths) + " |")
        out.append("|---|" + "---|" * len(lengths))
        for m in modes:
            cells = [_fmt(cell[m, L], metric, 3, with_ci=True) if (m, L) in cell else "–" for L in lengths]
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out.append("")
    paired = results.get("paired") if isinstance(results, dict) else None
    if paired:
        ref = paired[0]["reference"]
        out.append(f"**perplexity ratio to {ref}** (paired over the same windows: exp(mean loss difference)"
                   f"{_ci_words(rows)})\n")
        for scoring in dict.fromkeys(p["scoring"] for p in paired):
            sub = [p for p in paired if p["scoring"] == scoring]
            lengths = sorted({p["length"] for p in sub})
            cell = {(p["mode"], p["length"]): p for p in sub}
            out.append(f"| mode ({scoring}) | " + " | ".join(f"L={L}" for L in lengths) + " |")
            out.append("|---|" + "---|" * len(lengths))
            for m in dict.fromkeys(p["mode"] for p in sub):
                cells = [(f"{cell[m, L]['ppl_ratio']:.4f} [{cell[m, L]['ppl_ratio_ci'][0]:.4f}, "
                          f"{cell[m, L]['ppl_ratio_ci'][1]:.4f}]") if (m, L) in cell else "–" for L in lengths]
                out.append(f"| {m} | " + " | ".join(cells) + " |")
            out.append("")
    out.append("| mode | scoring | L | loss [CI] | ppl [CI] | bits/token | top-1 acc | tokens | windows | seeds |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out.append(f"| {r['mode']} | {r['scoring']} | {r['length']} | {_fmt(r, 'loss', 4, True)} | "
                   f"{_fmt(r, 'perplexity', 3, True)} | {_fmt(r, 'bits_per_token', 4)} | {_fmt(r, 'accuracy', 4)} | "
                   f"{r['tokens']} | {r['windows']} | {len(r['seeds'])} |")
    return "\n".join(out) + "\n"


def ci_series(label: str, pts: list[dict[str, Any]]):
    """A plot ``Series`` of perplexity vs length with the rows' confidence intervals as error
    bars (the std over hash seeds where a row has no interval)."""
    from plsh_dist.eval.plots import Series

    y = [p["perplexity_mean"] for p in pts]
    ci = [p.get("perplexity_ci") for p in pts]
    if all(c and all(math.isfinite(b) for b in c) for c in ci):
        return Series(label, [p["length"] for p in pts], y, ylow=[c[0] for c in ci], yhigh=[c[1] for c in ci])
    return Series(label, [p["length"] for p in pts], y, yerr=[p["perplexity_std"] for p in pts])


def write_outputs(results: dict[str, Any], out_dir: str | Path, stem: str = "results",
                  tensorboard: bool = True) -> dict[str, Path]:
    """results.json, results.md, ppl_vs_length.png and tensorboard scalars under ``out_dir``."""
    from plsh_dist.eval.plots import line_plot

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md", "plot": out / "ppl_vs_length.png"}
    paths["json"].write_text(json.dumps(results, indent=1) + "\n")
    paths["markdown"].write_text(format_table(results))
    rows = results["rows"]
    panels = []
    for scoring in dict.fromkeys(r["scoring"] for r in rows):
        series = []
        for mode in dict.fromkeys(r["mode"] for r in rows):
            pts = sorted((r for r in rows if r["mode"] == mode and r["scoring"] == scoring), key=lambda r: r["length"])
            if pts:
                series.append(ci_series(mode, pts))
        title = "all tokens" if scoring == "whole" else f"last {rows[0]['scored_per_window']} tokens"
        panels.append((title, series))
    c = results.get("ci") or {}
    ylabel = "perplexity" + (f" ({c['level']:.0%} CI over windows)" if c else "")
    line_plot(paths["plot"], panels, xlabel="context length (tokens)", ylabel=ylabel, logx=True, logy=True)
    if tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(out / "tensorboard")) as tb:
            for r in rows:
                for m in METRICS:
                    tb.add_scalar(f"extrapolation/{r['scoring']}/{m}/{r['mode']}", r[f"{m}_mean"], r["length"])
        paths["tensorboard"] = out / "tensorboard"
    return paths
