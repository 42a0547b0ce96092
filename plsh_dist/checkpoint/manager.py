"""The run's checkpoints as the training loop sees them: one object, built once (torchtitan's CheckpointManager).

``CheckpointManager(run)`` (``run``: the ``ResolvedRun`` of ``plsh_dist.config.resolved``) is all the
training loop does with checkpoints, in the order a run does it:

- ``find_resume()``: the checkpoint ``[checkpoint].resume`` names (``tags.find_resume``), checked against
  this config (``resume_check.py``) and the route to load it at this run's shape chosen
  (``run_shape.py``): once, before the data is prepared; ``check_tokenizer`` once the data preparation
  has the tokenizer;
- ``load(engine)``: the weights, optimizer and scheduler (``tags.load_checkpoint``, through DeepSpeed's
  universal checkpoint at another shape), the learning rate of the next step, the data position;
- ``accept(start_step)``: rank 0 records the run (its resolved config in ``out_dir``) and sets the
  checkpoints of an abandoned line aside (``line.set_aside_newer``);
- ``save(engine, step, ...)``: ``tags.save_checkpoint`` (manifest, publishing, the line pruned to
  ``keep_last``, a full disk named);
- ``export(engine, training)``: the safetensors export in ``out_dir/final`` (``export.py``).

The modules named do the work and keep their tests; the manager holds what a run carries between
them: the resume (tag and route), the tags known valid (pruning hashes the others once) and the
checkpoints this call wrote. Its errors are the modules' own: ValueError for a resume this config
cannot continue (a refused resume), ``CheckpointLoadError`` for a damaged or unsafe checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from plsh_dist.checkpoint.export import export_final
from plsh_dist.checkpoint.line import checkpoint_root, set_aside_newer
from plsh_dist.checkpoint.resume_check import check_resume_config, check_resume_tokenizer
from plsh_dist.checkpoint.run_shape import UNIVERSAL, RunShape, change_notice, resume_route, saved_shape
from plsh_dist.checkpoint.safe_load import CheckpointLoadError
from plsh_dist.checkpoint.tags import find_resume, load_checkpoint, save_checkpoint
from plsh_dist.config.record import write_resolved
from plsh_dist.config.resolved import ResolvedRun
from plsh_dist.config.schema import read_resolved

__all__ = ["CheckpointManager", "CheckpointLoadError"]


class CheckpointManager:
    """The checkpoints of one ``train`` call (module doc); every method is called on every rank."""

    def __init__(self, run: ResolvedRun):
        self.run = run
        self.cfg = run.cfg
        self.root = checkpoint_root(run.out_dir)
        """``out_dir/checkpoints``: where this run saves."""
        self.shape = RunShape.of(run)
        """The shape this run trains at (saved with each checkpoint)."""
        self.resume: tuple[Path, str] | None = None
        """(checkpoint root, tag) the run resumes from (``find_resume``), or None for a fresh run."""
        self.route: str | None = None
        """How ``resume`` loads at this shape: ``run_shape.SAME_FILES`` or ``UNIVERSAL``."""
        self.valid_tags: set[str] = set()
        """Tags of this run's checkpoint dir known valid (written, or verified on resume)."""
        self.load_s: float | None = None
        """Seconds loading the resumed checkpoint took (manifest check, every shard read); None: fresh run."""

    # --- resume -------------------------------------------------------------------------

    @property
    def tag_dir(self) -> Path | None:
        """The checkpoint resumed from, or None."""
        return None if self.resume is None else self.resume[0] / self.resume[1]

    @property
    def load_universal(self) -> bool:
        """The engine must be built to load DeepSpeed's universal checkpoint (a resume at another shape)."""
        return self.route == UNIVERSAL

    @property
    def continues_out_dir(self) -> bool:
        """The run resumes from ``out_dir``'s own checkpoints (it continues the run there)."""
        return self.resume is not None and self.resume[0].resolve() == self.root.resolve()

    def find_resume(self) -> tuple[Path, str] | None:
        """Where the run resumes from (``[checkpoint].resume``), checked against this config (fields, steps,
        schedule, a tokenizer file already there) and at this shape (the route; rank 0 says when the shape
        changes); ValueError where it cannot: a refused resume, before any data is prepared."""
        self.resume = find_resume(self.cfg.checkpoint.resume, self.run.out_dir)
        if self.resume is not None:
            check_resume_config(self.run, self.tag_dir)
            saved = saved_shape(self.tag_dir, self.run.device.type) or self.shape
            self.route = resume_route(saved, self.shape, self.tag_dir)
            if saved != self.shape and self.run.rank == 0:
                print(f"plsh_dist: {change_notice(saved, self.shape)}", flush=True)
        return self.resume

    def check_tokenizer(self, fingerprint: str) -> None:
        """ValueError unless the tokenizer the data preparation trained or loaded (SHA-256 ``fingerprint``)
        is the one the resumed checkpoint was trained with; nothing to check on a fresh run."""
        if self.resume is not None:
            check_resume_tokenizer(self.tag_dir, self.cfg.tokenizer.model_path, fingerprint)

    def load(self, engine) -> tuple[int, int]:
        """Collective: load the checkpoint ``find_resume`` found, if any, into ``engine`` ->
        ``(start_step, data position)``: the optimizer steps done and the global data-stream position
        to continue from, ``(0, 0)`` for a fresh run. The next step trains at this config's rate.

        A damaged or unsafe checkpoint raises ``CheckpointLoadError`` (the file named)."""
        if self.resume is None:
            return 0, 0
        t0 = time.time()
        state = load_checkpoint(engine, *self.resume, universal=self.load_universal)
        self.load_s = time.time() - t0
        if self.continues_out_dir:
            self.valid_tags.add(self.resume[1])  # its manifest was just checked
        _set_lr_of_next_step(engine)
        return int(state["step"]), _stream_position(state, self.tag_dir, self.cfg)

    # --- the run accepted, saves, export ----------------------------------------------

    def accept(self, start_step: int) -> None:
        """Rank 0, once the run is accepted: write its record (the resolved config, as the run was resolved:
        ``ResolvedRun.record``) into ``out_dir`` and move the checkpoints newer than ``start_step`` (an
        abandoned line, line.py) aside."""
        if self.run.rank == 0:
            write_resolved(self.run.record, self.run.out_dir)
            set_aside_newer(self.root, start_step, self.run.rank)

    def save(self, engine, step: int, *, loss: float | None, consumed_sequences: int,
             sources: dict[str, Any]) -> Path:
        """Collective: checkpoint after optimizer step ``step`` -> the published tag directory.

        The trainer state saved with it: the step, the data position (``consumed_sequences``, each
        source's progress ``sources``), the step's ``loss`` and this run's shape. ``DiskFullError``
        when the disk is full (the unfinished save removed, tags.py)."""
        state = {"step": step, "consumed_sequences": consumed_sequences, "sources": sources, "loss": loss,
                 "shape": self.shape.to_dict()}
        return save_checkpoint(engine, self.cfg, step, state, self.cfg.tokenizer.model_path, self.valid_tags)

    def export(self, engine, training: dict) -> Path:
        """Collective: safetensors weights + resolved config + tokenizer + model card in ``out_dir/final``;
        ``training``: the run's steps, tokens seen and evaluation, for the model card."""
        return export_final(engine, self.cfg, self.cfg.tokenizer.model_path, self.run.out_dir / "final", training)


def _stream_position(state: dict[str, Any], tag_dir: Path, cfg) -> int:
    """The global data-stream position saved with a checkpoint (``consumed_sequences``); for one
    written before it was saved, its micro-batches x its micro-batch size x its DP size (its config
    and shape), which is what that run had read."""
    if "consumed_sequences" in state:
        return int(state["consumed_sequences"])
    saved = read_resolved(tag_dir) if (tag_dir / "config.resolved.json").is_file() else cfg
    shape = saved_shape(tag_dir, "cpu")
    dp_size = shape.dp_size if shape is not None else 1
    return int(state["consumed_micro_batches"]) * saved.data.micro_batch_size * dp_size


def _set_lr_of_next_step(engine) -> None:
    """After loading a checkpoint: the next step trains at this config's rate for it.

    The restored optimizer holds the rate the checkpoint's scheduler set for that
    step; when the resumed config's schedule differs there (resume_check.py lets it
    differ only for steps not trained yet), the first resumed step would train at
    the old rate and the next ones at the new. The rate is the scheduler's own
    product (base rate x this config's factor at the restored step), so an
    unchanged schedule gets the very value it restored."""
    scheduler = engine.lr_scheduler
    rates = [base * factor(scheduler.last_epoch) for factor, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
    for group, lr in zip(engine.optimizer.param_groups, rates):
        group["lr"] = lr
    scheduler._last_lr = rates  # what get_last_lr() reports
