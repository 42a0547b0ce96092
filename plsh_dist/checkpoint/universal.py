"""A checkpoint in DeepSpeed's universal format, for a resume at another shape (run_shape.py).

``universal_checkpoint(tag_dir)`` runs DeepSpeed's own converter (``python -m
deepspeed.checkpoint.ds_to_universal``) on a tag into ``<checkpoint root>/universal/<tag>``, beside
the tag, which stays untouched; the engine then loads it with ``"checkpoint": {"load_universal":
true}`` and reshards every parameter's fp32 weights and AdamW moments over its own ranks. The
conversion is made once per tag and reused (its ``universal.json`` names the source manifest's
SHA-256; its own ``manifest.json`` is checked on load like any tag's); it is built in
``<tag>.partial`` and renamed when complete, so a killed conversion leaves only that, which the
next one removes.

One thing is added to DeepSpeed's output. Its converter writes a ZeRO-3 checkpoint and a ZeRO-1/2
one in two layouts, and each loader reads only its own (DeepSpeed 0.19): the model-states file's
name (``zero_pp_rank_0_mp_rank_00_model_states.pt`` / ``mp_rank_00_model_states.pt``), the
per-parameter tensors (flat / ``{"param": shaped tensor, "cat_dim": 0}``, with ``step.pt``) and the
optimizer's global state (``optimizer_state_dict`` / top-level ``param_groups``, ``ds_version``).
``bridge_layouts`` gives the converted folder both, so a ZeRO-1 run resumes at ZeRO-3 and back: it
renames, reshapes and copies what DeepSpeed wrote, computes nothing, and leaves the resharding to
the engine's loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from plsh_dist.checkpoint.manifest import MANIFEST, fsync_dir, write_manifest, write_text_atomic

UNIVERSAL_DIR = "universal"
STAMP = "universal.json"
ZERO12_MODEL_STATES = "mp_rank_00_model_states.pt"
ZERO3_MODEL_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"


class ConversionError(RuntimeError):
    """DeepSpeed's converter failed; the message holds its last lines."""


def universal_path(tag_dir: str | Path) -> Path:
    """Where the universal form of checkpoint ``tag_dir`` lives: ``<root>/universal/<tag>``."""
    tag_dir = Path(tag_dir)
    return tag_dir.parent / UNIVERSAL_DIR / tag_dir.name


def _source_fingerprint(tag_dir: Path) -> str:
    manifest = tag_dir / MANIFEST
    return hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else ""


def is_converted(tag_dir: str | Path) -> bool:
    """True when ``universal_path(tag_dir)`` is a finished conversion of this very tag."""
    stamp = universal_path(tag_dir) / STAMP
    try:
        return json.loads(stamp.read_text())["source_manifest_sha256"] == _source_fingerprint(Path(tag_dir))
    except (OSError, ValueError, KeyError):
        return False


def universal_checkpoint(tag_dir: str | Path, log=print) -> Path:
    """Convert checkpoint ``tag_dir`` (its DeepSpeed files) to the universal format, unless done
    before; returns the converted tag dir. One process calls it (rank 0); ConversionError if
    DeepSpeed's converter fails. ``log``: where the progress lines go."""
    tag_dir = Path(tag_dir)
    out = universal_path(tag_dir)
    if is_converted(tag_dir):
        log(f"checkpoint: using the universal checkpoint converted before, {out}")
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    log(f"checkpoint: converting {tag_dir} to DeepSpeed's universal checkpoint in {out} (the original stays as it is)")
    command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(tag_dir),
               "--output_folder", str(partial), "--inject_missing_state",
               "--num_extract_workers", str(_workers()), "--num_merge_workers", str(max(1, _workers() // 2))]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise ConversionError(f"DeepSpeed's ds_to_universal failed on {tag_dir} (exit {done.returncode}):\n{tail}")
    # The converter also points <root>/universal/latest_universal at its output; we name tags ourselves.
    (partial.parent / "latest_universal").unlink(missing_ok=True)
    bridge_layouts(partial)
    for name in ("trainer_state.json", "config.resolved.json", "config.resolved.toml", "tokenizer.model"):
        if (tag_dir / name).is_file():
            shutil.copy2(tag_dir / name, partial / name)
    write_text_atomic(partial / STAMP, json.dumps({"source": str(tag_dir),
                                                   "source_manifest_sha256": _source_fingerprint(tag_dir)}) + "\n")
    write_manifest(partial, alone=True)  # the resume checks it as it checks any tag
    os.replace(partial, out)
    fsync_dir(out.parent)
    return out


def _workers() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0))))


def bridge_layouts(folder: str | Path) -> None:
    """Make DeepSpeed's universal ``folder`` readable by its ZeRO-1/2 and its ZeRO-3 loader (module doc)."""
    folder = Path(folder)
    zero = folder / "zero"
    model_states = folder / ZERO12_MODEL_STATES
    if not model_states.is_file():
        model_states = folder / ZERO3_MODEL_STATES
    for name in (ZERO12_MODEL_STATES, ZERO3_MODEL_STATES):
        if not (folder / name).is_file():
            shutil.copy2(model_states, folder / name)
    meta = torch.load(model_states, map_location="cpu", weights_only=False)
    shapes = {name: shape for group in _as_groups(meta["param_shapes"]) for name, shape in group.items()}

    header_path = zero / "optimizer_state.pt"
    header = torch.load(header_path, map_location="cpu", weights_only=False)
    inner = header.get("optimizer_state_dict")
    step = inner["state"][0]["step"] if inner else _a_step(zero)
    header.setdefault("ds_version", meta.get("ds_version"))
    header.setdefault("clip_grad", meta.get("ds_config", {}).get("gradient_clipping", 0.0))
    header.setdefault("param_groups", inner["param_groups"] if inner else None)
    header.setdefault("optimizer_state_dict", {"state": {0: {"step": step}}, "param_groups": header["param_groups"]})
    torch.save(header, header_path)

    for name, shape in shapes.items():
        param_dir = zero / name
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            path = param_dir / f"{key}.pt"
            value = torch.load(path, map_location="cpu", weights_only=False)
            if isinstance(value, torch.Tensor):  # ZeRO-3's flat tensor
                torch.save({"param": value.view(shape), "cat_dim": 0}, path)
        if not (param_dir / "step.pt").is_file():
            torch.save(step, param_dir / "step.pt")


def _as_groups(param_shapes) -> list[dict]:
    """DeepSpeed's ``param_shapes``: one ``{name: shape}`` per optimizer group (a list), or one dict."""
    return list(param_shapes) if isinstance(param_shapes, (list, tuple)) else [param_shapes]


def _a_step(zero: Path):
    """The optimizer step count from any parameter's ``step.pt`` (all equal: one AdamW step count)."""
    return torch.load(next(zero.glob("*/step.pt")), map_location="cpu", weights_only=False)
