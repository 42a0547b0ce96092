"""Which checkpoint tags a run keeps: its own line of training, valid tags only, the newest ``keep_last``.

Invariant: **pruning never leaves a run without its newest valid checkpoint.** Once a run is
accepted, ``set_aside_newer`` moves the tags newer than its start to ``checkpoints/abandoned/``
(``latest`` first pointed at the newest tag that stays); at every save ``prune`` keeps the newest
``keep_last`` tags that pass their manifest, moves a failing one to ``checkpoints/damaged/`` and
deletes older ones through ``<tag>.deleting``. Why counting by number alone breaks the invariant,
and the fault points (``in_set_aside``, ``in_prune``): docs/training.md, "Checkpoints kept, set
aside and pruned".
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import torch.distributed as dist

from plsh_dist.checkpoint.manifest import MANIFEST, fsync_dir, verify_manifest, write_text_atomic
from plsh_dist.faults import maybe_fail

logger = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
"""Suffix of a tag directory still being written (or left by a crash)."""
DELETING_SUFFIX = ".deleting"
ABANDONED = "abandoned"
"""Sub-directory of ``checkpoints/`` holding the tags of an abandoned line of training."""
DAMAGED = "damaged"
"""Sub-directory of ``checkpoints/`` holding tags that failed their manifest when pruning."""
_TAG = re.compile(r"^step_(\d{8})$")
_UNFINISHED = re.compile(r"^step_\d{8}(\.partial|\.deleting)$")


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def tag_for_step(step: int) -> str:
    return f"step_{step:08d}"


def step_of(tag: str) -> int:
    """``"step_00000100"`` -> 100."""
    match = _TAG.match(tag)
    if match is None:
        raise ValueError(f"{tag!r} is not a checkpoint tag (step_NNNNNNNN)")
    return int(match.group(1))


def complete_tags(root: str | Path) -> list[str]:
    """Published tags under ``root`` (oldest first); partial/deleting dirs are not tags,
    nor is anything under ``abandoned/`` or ``damaged/``."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and _TAG.match(p.name) and (p / "trainer_state.json").is_file())


def unfinished(root: Path) -> list[Path]:
    """``<tag>.partial`` / ``<tag>.deleting`` dirs left by an interrupted save or delete."""
    return sorted(p for p in root.iterdir() if p.is_dir() and _UNFINISHED.match(p.name)) if root.is_dir() else []


def remove_tag(path: Path) -> None:
    """Delete a tag so that no half-deleted directory keeps a tag's name."""
    doomed = path.with_name(path.name + DELETING_SUFFIX)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _move_aside(root: Path, tag: str, where: str) -> Path:
    """Rename ``root/tag`` to ``root/where/tag`` (or ``tag.2``, ``tag.3``... if taken)."""
    target_dir = root / where
    target_dir.mkdir(exist_ok=True)
    target, n = target_dir / tag, 1
    while target.exists():
        n += 1
        target = target_dir / f"{tag}.{n}"
    os.replace(root / tag, target)
    fsync_dir(root)
    return target


def set_aside_newer(root: str | Path, step: int, rank: int = 0) -> list[Path]:
    """Rank 0, once a run starting at ``step`` is accepted: move every tag newer than
    ``step`` to ``abandoned/`` (module doc); returns their new paths."""
    root = Path(root)
    tags = complete_tags(root)
    newer = [t for t in tags if step_of(t) > step]
    if not newer:
        return []
    staying = [t for t in tags if step_of(t) <= step]
    latest = root / "latest"
    if staying:  # ``latest`` first: from here on "auto" resumes from a tag that stays
        write_text_atomic(latest, staying[-1])
    else:
        latest.unlink(missing_ok=True)
        fsync_dir(root)
    maybe_fail("in_set_aside", step, rank)
    moved = [_move_aside(root, tag, ABANDONED) for tag in reversed(newer)]
    logger.warning("this run continues from step %d: %d newer checkpoint(s) of an abandoned line of training "
                   "moved aside, not deleted: %s", step, len(moved), ", ".join(str(p) for p in moved))
    return moved


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def prune(root: str | Path, keep: int, valid_tags: set[str], step: int) -> None:
    """Collective (every rank, after the new tag ``step`` is published and a barrier):
    keep the newest ``keep`` valid tags, move damaged ones in that window to
    ``damaged/``, delete the older ones. ``keep <= 0`` keeps everything.

    ``valid_tags``: tags known good (written or verified by this process); the
    tags verified here are added. Every rank verifies a share of the files
    (``verify_manifest``); rank 0 alone moves and deletes.
    """
    if keep <= 0:
        return
    root = Path(root)
    tags = complete_tags(root)
    kept: list[str] = []
    damaged: list[tuple[str, list[str]]] = []
    for tag in reversed(tags):
        if len(kept) == keep:
            break
        if tag not in valid_tags and (root / tag / MANIFEST).is_file():
            problems = verify_manifest(root / tag)
            if problems:
                damaged.append((tag, problems))
                continue
        valid_tags.add(tag)  # a tag without a manifest predates checksums: counted, as resume accepts it
        kept.append(tag)
    rank = _rank()
    maybe_fail("in_prune", step, rank)
    if rank != 0:
        return
    for tag, problems in damaged:
        where = _move_aside(root, tag, DAMAGED)
        logger.warning("checkpoint %s fails its manifest (%s): moved to %s, not counted as kept",
                       tag, "; ".join(problems), where)
    if not kept:
        return
    skip = set(kept) | {tag for tag, _ in damaged}
    for tag in tags:  # everything older than the oldest tag kept
        if tag not in skip and step_of(tag) < step_of(kept[-1]):
            remove_tag(root / tag)
