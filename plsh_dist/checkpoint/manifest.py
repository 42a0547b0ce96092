"""Durable writes and the checksum manifest of a checkpoint directory.

Why a manifest: a kill or a full disk during ``torch.save`` leaves a short
file, and a bit flip in tensor bytes loads silently (torch's zip reader checks
no CRC). ``manifest.json`` records the size and SHA-256 of every file of a tag;
resume checks them before DeepSpeed reads anything, on every rank alike, so a
damaged shard gives one clear error naming the file instead of wrong weights
or a rank stuck in a collective.

Hashing and checking are split over the ranks (rank ``r`` takes files
``r, r + world, ...``); the verdicts are gathered so every rank sees them all.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch.distributed as dist


MANIFEST = "manifest.json"
_CHUNK = 8 << 20  # bytes read per hash update


def fsync_dir(path: Path) -> None:
    """Make a rename/creation inside ``path`` durable (POSIX: fsync the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``path`` so that readers see the old content or the new, never a mix (nor an empty file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # e.g. a full disk: no half-written file left behind
        raise
    fsync_dir(path.parent)


def _digest(path: Path, fsync: bool) -> dict[str, int | str]:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
        if fsync:  # the data must be on disk before the directory is published
            os.fsync(fh.fileno())
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def _files(tag_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(tag_dir)) for p in tag_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(local: dict) -> dict:
    rank, world = _world()
    if world == 1:
        return local
    parts: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(parts, local)
    merged: dict = {}
    for part in parts:
        merged.update(part)
    return merged


def write_manifest(tag_dir: Path, *, alone: bool = False) -> None:
    """Collective: hash (and fsync) every file of ``tag_dir``; rank 0 writes ``manifest.json``.

    Every rank must see the same files (call after a barrier). ``alone``: this process hashes
    every file and writes the manifest itself (not collective)."""
    rank, world = (0, 1) if alone else _world()
    names = _files(tag_dir)
    local = {n: _digest(tag_dir / n, fsync=True) for n in names[rank::world]}
    entries = local if alone else _gather(local)
    if rank == 0:
        write_text_atomic(tag_dir / MANIFEST, json.dumps({"files": entries}, indent=1, sort_keys=True) + "\n")


def verify_manifest(tag_dir: Path) -> list[str]:
    """Collective: check every file listed in ``tag_dir/manifest.json``.

    Returns one line per problem (missing, wrong size, wrong hash), the same
    list on every rank; ``[]`` when all files match.
    """
    rank, world = _world()
    manifest = tag_dir / MANIFEST
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{manifest}: unreadable manifest ({type(exc).__name__}: {exc})"]
    problems: dict[str, str] = {}
    for name in sorted(files)[rank::world]:
        path, want = tag_dir / name, files[name]
        if not path.is_file():
            problems[name] = f"{path}: missing"
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems[name] = f"{path}: {size} bytes, expected {want['size']} (truncated or overwritten)"
        elif _digest(path, fsync=False)["sha256"] != want["sha256"]:
            problems[name] = f"{path}: SHA-256 differs from the manifest (corrupted)"
    merged = _gather(problems)
    return [merged[k] for k in sorted(merged)]
