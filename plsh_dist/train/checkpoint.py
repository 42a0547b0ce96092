"""Checkpoints: DeepSpeed's format plus the resolved config, the tokenizer and the trainer state.

Layout under ``out_dir/checkpoints``::

    latest                      DeepSpeed's pointer to the newest tag
    step_00000100/              one tag = one optimizer step
        (DeepSpeed model/optimizer shards, one per rank / ZeRO partition)
        config.resolved.toml    the run config as resolved at launch
        config.resolved.json
        tokenizer.model         the tokenizer the run trains with
        trainer_state.json      step, consumed sequences, last metrics

The trainer state also travels in DeepSpeed's ``client_state`` (what resume
reads); the JSON copy is for humans and tools.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from plsh_dist.train.config import RunConfig, write_resolved

__all__ = ["checkpoint_root", "tag_for_step", "find_resume", "save_checkpoint", "load_checkpoint"]

_TAG = re.compile(r"^step_(\d{8})$")


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def tag_for_step(step: int) -> str:
    return f"step_{step:08d}"


def _tags(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _TAG.match(p.name))


def find_resume(resume: str, out_dir: str | Path) -> tuple[Path, str] | None:
    """Where to resume from: ``(load_dir, tag)`` or None for a fresh start.

    ``resume``: "auto" = the newest complete checkpoint in ``out_dir`` if any;
    "never" = fresh start; otherwise a tag directory (``.../step_00000100``).
    """
    if resume == "never":
        return None
    if resume == "auto":
        root = checkpoint_root(out_dir)
        # A tag counts once its trainer_state.json exists: it is written last.
        complete = [t for t in _tags(root) if (root / t / "trainer_state.json").is_file()]
        return (root, complete[-1]) if complete else None
    path = Path(resume)
    if not (path / "trainer_state.json").is_file():
        raise ValueError(
            f"[checkpoint].resume = {resume!r} is not a complete checkpoint directory "
            f"(no trainer_state.json); use \"auto\", \"never\" or a path like out_dir/checkpoints/step_00000100"
        )
    return path.parent, path.name


def save_checkpoint(engine, cfg: RunConfig, step: int, state: dict[str, Any], tokenizer_path: str | Path) -> Path:
    """Collective: every rank must call it. Returns the tag directory."""
    root = checkpoint_root(cfg.run.out_dir)
    tag = tag_for_step(step)
    engine.save_checkpoint(str(root), tag=tag, client_state={"trainer_state": state})
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        tag_dir = root / tag
        write_resolved(cfg, tag_dir)
        if Path(tokenizer_path).is_file():
            shutil.copy2(tokenizer_path, tag_dir / "tokenizer.model")
        (tag_dir / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
        keep = cfg.checkpoint.keep_last
        if keep > 0:
            for old in _tags(root)[:-keep]:
                shutil.rmtree(root / old, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return root / tag


def load_checkpoint(engine, load_dir: Path, tag: str) -> dict[str, Any]:
    """Restore model, optimizer, scheduler; return the trainer state saved with it."""
    path, client_state = engine.load_checkpoint(str(load_dir), tag=tag)
    if path is None or client_state is None or "trainer_state" not in client_state:
        raise RuntimeError(f"could not load checkpoint {load_dir / tag}: DeepSpeed found no valid state")
    return client_state["trainer_state"]
