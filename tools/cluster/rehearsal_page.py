"""The rehearsal's record as JSON and as a markdown page (``results/cluster/rehearsal.md`` for the real one)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

__all__ = ["write_record"]


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**30:.2f} GiB"


def _flop(x: float) -> str:
    return f"{x / 1e12:.2f} TFLOP" if x >= 1e11 else f"{x / 1e9:.3f} GFLOP"


def _cell(text: str) -> str:
    """One markdown table cell: no line breaks, no column bars."""
    return " ".join(str(text).split()).replace("|", "/")


def _versions() -> str:
    import deepspeed
    import torch
    import transformers

    return (f"Python {platform.python_version()}, torch {torch.__version__}, DeepSpeed {deepspeed.__version__}, "
            f"transformers {transformers.__version__}, {os.cpu_count()} CPU cores")


def _phases(rep: dict) -> list[str]:
    rows = ["| phase | wall | result |", "|---|---|---|"]
    rows += [f"| {p['name']} | {p['wall_s']:.1f} s | {'ok' if p['ok'] else 'FAILED'}: {_cell(p['detail'])} |"
             for p in rep["phases"]]
    return rows


def _checks(rep: dict) -> list[str]:
    rows = ["| check | result | found |", "|---|---|---|"]
    rows += [f"| {c['name']} | {'pass' if c['ok'] else 'FAIL'} | {_cell(c['detail'])[:600]} |" for c in rep["checks"]]
    return rows


def _losses(rep: dict) -> list[str]:
    ref, res = rep.get("reference", {}), rep.get("resumed", {})
    if not ref:
        return []
    rows = ["| step | uninterrupted loss | killed, then resumed | grad norm (uninterrupted) |", "|---|---|---|---|"]
    for step, loss in sorted(ref["losses"].items(), key=lambda kv: int(kv[0])):
        other = res.get("losses", {}).get(step)
        rows.append(f"| {step} | {loss!r} | {other!r} | {ref['grad_norms'][step]!r} |")
    return rows


def _checkpoints(rep: dict) -> list[str]:
    saves = [(phase, save) for phase in ("reference", "killed", "resumed")
             for save in rep.get(phase, {}).get("saves", [])]
    lines = [f"- save: {phase} run, {x['tag']}: {x['save_s']:.2f} s, {x['size_mib']:.1f} MiB" for phase, x in saves]
    if rep.get("checkpoint"):
        lines.append(f"- the checkpoint that survived the kill: {rep['checkpoint']['tag']}, "
                     f"{rep['checkpoint']['size_bytes'] / 2**20:.1f} MiB (ZeRO-3 shards of both ranks, "
                     "AdamW moments included)")
    if rep.get("resumed", {}).get("load_s") is not None:
        lines.append(f"- load on resume (manifest check + every shard read, both ranks): "
                     f"{rep['resumed']['load_s']:.2f} s")
    if rep.get("export"):
        lines.append(f"- export (safetensors, config, tokenizer): {rep['export']['size_bytes'] / 2**20:.1f} MiB")
    return lines


def _plan(rep: dict) -> list[str]:
    plan, measured = rep.get("plan"), rep.get("measured")
    if not plan:
        return []
    lines = ["| per rank | planner | measured |", "|---|---|---|"]
    peaks = (measured or {}).get("peak_rss_bytes", {})
    shown = ", ".join(f"{k} {_gib(v)}" for k, v in peaks.items()) or "-"
    lines.append(f"| peak memory | {_gib(plan['peak_bytes_per_rank'])} live torch bytes (at {plan['peak_at']}) | "
                 f"peak RSS (VmHWM): {shown} |")
    steps = (measured or {}).get("step_s", {})
    if steps:
        mean = sum(steps.values()) / len(steps)
        per_rank = plan["step_flops_per_rank"]
        lines.append(f"| step FLOPs | {_flop(per_rank)} per rank ({_flop(plan['step_flops'])} in all, attention "
                     f"{_flop(plan['attention_flops'])}) | step times "
                     f"{', '.join(f'{v:.1f} s' for v in steps.values())}: {per_rank / mean / 1e9:.1f} GFLOP/s per "
                     "rank at the planner's count |")
    else:
        lines.append(f"| step FLOPs | {_flop(plan['step_flops_per_rank'])} per rank | - |")
    return lines + ["", "The planner counts live torch tensor bytes; the kernel's high-water mark of the "
                        "resident set adds the interpreter, the libraries and the allocator's caching. FLOPs "
                        "are the planner's count, not a measured one: the measured side is the step time."]


def _page(rep: dict) -> str:
    m = rep["model"]
    title = "The rehearsal's tiny stand-in" if rep["tiny"] else "The 0.6B rehearsal"
    out = [
        f"# {title} across two namespace hosts",
        "",
        f"{'Passed' if rep['ok'] else 'FAILED'}: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(rep['finished']))}, "
        f"{rep['versions']}; {_gib(rep['machine']['total_bytes'])} of memory "
        f"({_gib(rep['machine']['available_bytes'])} available at the start).",
        "",
        "    " + rep["command"],
        "",
        f"`{rep['config']}`: {m['family']}, {m['layers']} layers, hidden {m['hidden']}, {m['heads']}/{m['kv_heads']} "
        f"heads, D = {m['head_dim']}, vocabulary {m['vocab']:,}, {m['parameters']:,} parameters; attention "
        f"`{rep['trained_mode']}`. {rep['steps']} steps of {rep['seq_len']:,} tokens, SP = {rep['sp_size']} "
        "with one rank on each host (node-0, node-1), DeepSpeed's hostfile runner over pdsh/ssh. "
        "What the config changes on CPU:",
        "",
        "    " + " ".join(rep["overrides"]),
        "",
        "## Phases",
        "",
        *_phases(rep),
        "",
        *([f"Stopped: {rep['stopped']}", ""] if rep.get("stopped") else []),
        "## Checks",
        "",
        *_checks(rep),
        "",
        "## Losses",
        "",
        *_losses(rep),
        "",
        "## Checkpoints",
        "",
        *_checkpoints(rep),
        "",
        "## Planner beside the measured run (the uninterrupted one)",
        "",
        *_plan(rep),
        "",
        "## Commands of the phases",
        "",
        *[f"- {name}: `{cmd}`" for name, cmd in rep.get("commands", {}).items()],
        "",
    ]
    return "\n".join(out)


def write_record(rep: dict[str, Any], json_path: Path, page_path: Path, root: Path) -> None:
    """``rep`` (the rehearsal's report) to ``json_path`` and its page to ``page_path``; paths under the
    repository ``root`` are written relative to it (the page is committed; its commands run from there)."""
    rep.setdefault("finished", time.time())
    rep.setdefault("versions", _versions())
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(rep, indent=1, default=str) + "\n")
    page_path.parent.mkdir(parents=True, exist_ok=True)
    page_path.write_text(_page(rep).replace(f"{Path(root).resolve()}/", ""))
