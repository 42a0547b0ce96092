"""Checkpoints: DeepSpeed's format plus the resolved config, the tokenizer and the trainer state.

Layout under ``out_dir/checkpoints``::

    latest                      name of the newest published tag (moved last)
    step_00000100/              one tag = one optimizer step
        (DeepSpeed model/optimizer shards, one per rank / ZeRO partition)
        config.resolved.toml    the run config as resolved at launch
        config.resolved.json
        tokenizer.model         the tokenizer the run trains with
        trainer_state.json      step, consumed sequences, last metrics
        manifest.json           size + SHA-256 of every file above
    step_00000200.partial/      a save in progress, or one a crash interrupted: ignored
    abandoned/step_00000300/    newer than the step a run resumed from: set aside, never counted
    damaged/step_00000050/      failed its manifest when pruning: set aside, never counted

Publishing is atomic (``<tag>.partial``, fsync, rename, ``latest`` last; old tags renamed to
``<tag>.deleting`` before deletion), so a kill leaves the previous checkpoint and ``latest``
complete; which tags stay is ``line.py``'s job; resume reads with ``torch.load(weights_only=True)``
(``safe_load.py``). Why and what it guarantees: docs/training.md, "Checkpoints kept, set aside and
pruned" and "Resume". The trainer state also travels in DeepSpeed's ``client_state`` (what resume
reads); the JSON copy is for humans and tools.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from plsh_dist.checkpoint.disk_full import DiskFullError, free_bytes, is_disk_full, release_frames
from plsh_dist.checkpoint.line import (
    DELETING_SUFFIX,
    PARTIAL_SUFFIX,
    checkpoint_root,
    complete_tags,
    prune,
    remove_tag,
    tag_for_step,
    unfinished,
)
from plsh_dist.checkpoint.manifest import MANIFEST, fsync_dir, verify_manifest, write_manifest, write_text_atomic
from plsh_dist.checkpoint.safe_load import CheckpointLoadError, install_safe_loader
from plsh_dist.checkpoint.universal import ConversionError, universal_checkpoint
from plsh_dist.config.record import write_resolved
from plsh_dist.config.schema import RunConfig
from plsh_dist.faults import maybe_fail

logger = logging.getLogger(__name__)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def find_resume(resume: str, out_dir: str | Path) -> tuple[Path, str] | None:
    """Where to resume from: ``(load_dir, tag)`` or None for a fresh start.

    ``resume``: "auto" = the checkpoint ``latest`` names (or, if it is missing
    or names no complete tag, the newest complete one) in ``out_dir``, if any;
    "never" = fresh start; otherwise a tag directory (``.../step_00000100``).
    Interrupted saves (``*.partial``) are ignored, with a log line.
    """
    if resume == "never":
        return None
    if resume == "auto":
        root = checkpoint_root(out_dir)
        left = unfinished(root)
        if left:
            logger.warning("ignoring %d incomplete checkpoint dir(s) left by an interrupted save or delete: %s",
                           len(left), ", ".join(str(p) for p in left))
        complete = complete_tags(root)
        if not complete:
            return None
        latest = root / "latest"
        named = latest.read_text().strip() if latest.is_file() else None
        if named in complete:
            return root, named
        logger.warning("%s names %r, not a complete checkpoint; resuming from the newest complete one, %s",
                       latest, named, complete[-1])
        return root, complete[-1]
    path = Path(resume)
    if path.name.endswith((PARTIAL_SUFFIX, DELETING_SUFFIX)):
        raise ValueError(f"[checkpoint].resume = {resume!r} is an unfinished checkpoint (its save or delete was "
                         f"interrupted) and cannot be trusted; use one without the suffix, \"auto\" or \"never\"")
    if not (path / "trainer_state.json").is_file():
        raise ValueError(
            f"[checkpoint].resume = {resume!r} is not a complete checkpoint directory "
            f"(no trainer_state.json); use \"auto\", \"never\" or a path like out_dir/checkpoints/step_00000100"
        )
    return path.parent, path.name


def _publish(root: Path, partial: Path, tag: str) -> None:
    """Rank 0: rename the finished ``partial`` dir to ``tag``, then point ``latest`` at it."""
    final = root / tag
    if final.exists():  # saved again after resuming from an earlier tag
        remove_tag(final)
    os.replace(partial, final)
    fsync_dir(root)
    write_text_atomic(root / "latest", tag)  # DeepSpeed's pointer format: the bare tag


def save_checkpoint(engine, cfg: RunConfig, step: int, state: dict[str, Any], tokenizer_path: str | Path,
                    valid_tags: set[str] | None = None) -> Path:
    """Collective: every rank must call it. Returns the published tag directory.

    Order (each step durable before the next): DeepSpeed writes its shards into
    ``<tag>.partial``; rank 0 adds config, tokenizer and trainer state; all
    ranks hash + fsync the files into ``manifest.json``; rank 0 renames the
    directory to ``<tag>``, then replaces ``latest``; then old tags are pruned
    (``line.prune``: the newest ``keep_last`` valid ones stay).
    A write that fails for lack of space raises ``DiskFullError`` ("disk full",
    the path named) after removing the unfinished ``<tag>.partial``.

    ``valid_tags``: tags this process wrote or verified (the training session
    keeps it across saves so older tags are hashed once); the new tag is added.
    """
    root = checkpoint_root(cfg.run.out_dir)
    tag = tag_for_step(step)
    partial = root / (tag + PARTIAL_SUFFIX)
    rank = _rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in unfinished(root):  # left by a crash; nobody else writes here now
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    try:
        engine.save_checkpoint(str(root), tag=partial.name, client_state={"trainer_state": state}, save_latest=False)
        maybe_fail("in_checkpoint", step, rank)
        if rank == 0:
            write_resolved(cfg, partial)
            if Path(tokenizer_path).is_file():
                shutil.copy2(tokenizer_path, partial / "tokenizer.model")
            (partial / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
        _barrier()
        write_manifest(partial)
        _barrier()
        if rank == 0:
            _publish(root, partial, tag)
    except (OSError, RuntimeError) as exc:
        if not is_disk_full(exc, root):
            raise
        raise _disk_full(root, partial, exc, cfg.checkpoint.resume) from exc
    _barrier()
    valid_tags = set() if valid_tags is None else valid_tags
    valid_tags.add(tag)
    prune(root, cfg.checkpoint.keep_last, valid_tags, step)
    _barrier()
    return root / tag


def _disk_full(root: Path, partial: Path, exc: BaseException, resume: str = "auto") -> DiskFullError:
    """The error of a save that ran out of space. The unfinished save is removed first (never
    published, and a later save would remove it anyway): that frees the space the failure report
    and the next attempt need. The writer that failed still holds its file open from the frames of
    ``exc``'s traceback; clearing their locals closes it, so the space is really freed.

    The advice is what rerunning does under this run's ``[checkpoint].resume`` (``resume``): only
    ``auto`` continues from the newest checkpoint here; ``never`` or another checkpoint would move
    this run aside, its checkpoints with it, and start over, so the command needs ``--resume auto``."""
    free = free_bytes(root)  # when the write failed
    release_frames(exc)
    shutil.rmtree(partial, ignore_errors=True)
    tags = complete_tags(root)
    kept = f"the newest complete checkpoint, {root / tags[-1]}, is intact" if tags else "no earlier checkpoint exists"
    rerun = "the same command again"
    if not tags:
        again = "it starts again from step 0" if resume in ("auto", "never") else f"it resumes from {resume} again"
    elif resume == "auto":
        again = "it resumes from there"
    else:
        start = "step 0" if resume == "never" else resume
        rerun = "the same command with --resume auto (in place of any --resume or --checkpoint.resume it has)"
        again = (f"it resumes from there (as written, [checkpoint].resume = {resume!r} would move this run aside, "
                 f"its checkpoints with it, and start again from {start})")
    return DiskFullError(
        f"disk full: no space left to write checkpoint {partial}"
        + (f" ({free / 2**20:.1f} MiB were free on its filesystem)" if free is not None else "")
        + f"; the unfinished save was removed and {kept}. Free space there (or move [run].out_dir to a larger "
        f"disk) and run {rerun}: {again}")


def _advice(load_dir: Path, tag: str) -> str:
    earlier = [t for t in complete_tags(load_dir) if t < tag]
    if earlier:
        return (f"Resume from the previous checkpoint with --resume={load_dir / earlier[-1]}, "
                f"or start fresh with --resume never.")
    return "No earlier checkpoint exists here: start fresh with --resume never (or move this one aside)."


def load_checkpoint(engine, load_dir: Path, tag: str, *, universal: bool = False) -> dict[str, Any]:
    """Collective: restore model, optimizer, scheduler; return the trainer state saved with it.

    Raises ``CheckpointLoadError`` (naming the file) for a missing, truncated,
    corrupted or unsafe file.

    ``universal``: the engine was built with ``"load_universal": true`` (a resume at another
    shape, run_shape.py): the tag is checked, converted to DeepSpeed's universal format by rank 0
    (once; universal.py) and loaded from there.
    """
    load_dir = Path(load_dir)
    tag_dir = load_dir / tag
    advice = _advice(load_dir, tag)
    _check_manifest(tag_dir, advice)
    if universal:
        tag_dir = _converted(tag_dir, advice)
        load_dir = tag_dir.parent
        _check_manifest(tag_dir, advice)
    install_safe_loader(engine, advice)
    path, client_state = engine.load_checkpoint(str(load_dir), tag=tag)
    if path is None or client_state is None or "trainer_state" not in client_state:
        raise CheckpointLoadError(f"could not load checkpoint {tag_dir}: DeepSpeed found no valid state. {advice}")
    return client_state["trainer_state"]


def _check_manifest(tag_dir: Path, advice: str) -> None:
    if (tag_dir / MANIFEST).is_file():
        problems = verify_manifest(tag_dir)
        if problems:
            raise CheckpointLoadError(f"checkpoint {tag_dir} is damaged: {'; '.join(problems)}. {advice}",
                                      every_rank=True)  # verify_manifest gives every rank the same verdict
    elif _rank() == 0:
        logger.warning("%s has no %s (written before checksums existed): its files are not verified", tag_dir,
                       MANIFEST)


def _converted(tag_dir: Path, advice: str) -> Path:
    """Collective: rank 0 converts ``tag_dir`` to the universal format (or finds it converted); every
    rank gets its path, or the same ``CheckpointLoadError`` when DeepSpeed's converter failed."""
    verdict: list[Any] = [None]
    if _rank() == 0:
        try:
            verdict[0] = str(universal_checkpoint(tag_dir, log=lambda line: print(line, flush=True)))
        except (ConversionError, OSError) as exc:
            verdict[0] = {"error": f"could not convert checkpoint {tag_dir} to DeepSpeed's universal checkpoint: "
                                   f"{exc}. {advice}"}
    if dist.is_initialized():
        dist.broadcast_object_list(verdict, src=0)
    if isinstance(verdict[0], dict):
        raise CheckpointLoadError(verdict[0]["error"], every_rank=True)
    return Path(verdict[0])
