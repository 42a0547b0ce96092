"""Is there room on out_dir's disk for the checkpoints a run keeps? Checked before any work.

A save writes a whole new checkpoint before pruning the old ones (``checkpoint.tags``), so
with ``[checkpoint].keep_last = k`` the disk holds up to ``k + 1`` checkpoints at once
(every one the run writes when ``k = 0``); those of the out_dir a resume continues are
already on the disk. The size of one comes from the parameter count, the ZeRO stage and
the precision (``zero_states.checkpoint_bytes``). Too little free space refuses the run,
naming the figures and the fixes, instead of a disk-full error at the first save after
hours of training (docs/training.md, "Checkpoints kept, set aside and pruned").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from plsh_dist.checkpoint.disk_full import free_bytes
from plsh_dist.checkpoint.line import checkpoint_root, complete_tags, step_of
from plsh_dist.config.schema import resolve_master_weights, resolve_precision
from plsh_dist.plan.shapes import model_shapes
from plsh_dist.plan.zero_states import checkpoint_bytes

_MIB = 2**20


@dataclass(frozen=True)
class CheckpointSpace:
    """The disk a run's checkpoints need on out_dir's filesystem."""

    checkpoint: int
    """Bytes of one checkpoint (DeepSpeed's files, the tokenizer copy, configs and manifest)."""
    new_at_once: int
    """Checkpoints this run adds to the disk at its fullest (those a resume continues already there)."""
    free: int | None
    """Bytes free on the filesystem now (None: it does not say)."""

    @property
    def needed(self) -> int:
        return self.checkpoint * self.new_at_once


def _saves(every_steps: int, start: int, max_steps: int) -> int:
    """Checkpoints a run from step ``start`` to ``max_steps`` writes: the periodic ones, the final one."""
    if start >= max_steps:
        return 0
    periodic = (max_steps - 1) // every_steps - start // every_steps if every_steps else 0
    return periodic + 1


def _continued(cfg) -> tuple[int, int]:
    """(checkpoints of out_dir this run continues, the step it starts from), as ``find_resume`` will see them."""
    root = checkpoint_root(cfg.run.out_dir)
    tags = complete_tags(root)
    resume = cfg.checkpoint.resume
    if resume == "never":
        return 0, 0
    if resume == "auto":
        return (len(tags), step_of(tags[-1])) if tags else (0, 0)
    path = Path(resume)
    try:
        start = step_of(path.name)
    except ValueError:  # not a tag directory: the resume check refuses it later
        return 0, 0
    continues = path.parent.resolve() == root.resolve() if root.is_dir() else False
    return (len(tags) if continues else 0), start


def checkpoint_space(cfg, *, device: str) -> CheckpointSpace:
    """What ``cfg`` (a resolved ``RunConfig``) will keep on its out_dir's disk, and what is free there.
    ``device``: "cuda" or "cpu" (what precision = "auto" resolves to)."""
    ds = cfg.deepspeed
    precision = resolve_precision(ds, device)
    params = model_shapes(cfg.model, cfg.attention).params
    one = checkpoint_bytes(params=params, stage=ds.zero_stage, precision=precision,
                           master_weights=resolve_master_weights(ds, device))
    tokenizer = Path(cfg.tokenizer.model_path)
    one += (tokenizer.stat().st_size if tokenizer.is_file() else 0) + _MIB  # configs, manifest, file framing
    existing, start = _continued(cfg)
    saves = _saves(cfg.checkpoint.every_steps, start, cfg.run.max_steps)
    keep = cfg.checkpoint.keep_last
    new = (max(1, min(keep + 1, existing + saves) - existing) if keep else saves) if saves else 0
    where = Path(cfg.run.out_dir).absolute()
    while not where.exists() and where.parent != where:
        where = where.parent
    return CheckpointSpace(checkpoint=one, new_at_once=new, free=free_bytes(where))


def check_checkpoint_space(cfg, *, device: str) -> None:
    """ValueError naming the figures and the fixes when out_dir's filesystem has less free space
    than the checkpoints ``cfg`` keeps at once (module doc); nothing when it does not say."""
    space = checkpoint_space(cfg, device=device)
    if space.free is None or space.free >= space.needed:
        return
    keep = cfg.checkpoint.keep_last
    held = (f"[checkpoint].keep_last = {keep} keeps up to {keep + 1} checkpoints on disk at once ({keep} kept + the "
            f"one being written)" if keep else "[checkpoint].keep_last = 0 keeps every checkpoint")
    raise ValueError(
        f"[run].out_dir = {cfg.run.out_dir!r}: not enough free disk for the run's checkpoints: {held}; this run adds "
        f"{space.new_at_once} of ~{space.checkpoint / _MIB:,.1f} MiB each ({space.needed / _MIB:,.1f} MiB), but its "
        f"filesystem has {space.free / _MIB:,.1f} MiB free. Free space there, lower [checkpoint].keep_last"
        + (" or raise [checkpoint].every_steps" if cfg.checkpoint.every_steps else "")
        + ", or choose another [run].out_dir on a larger disk")
