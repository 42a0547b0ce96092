"""The run config resolved for the world and device it runs on, once: ``resolve_run`` -> ``ResolvedRun``.

A ``RunConfig`` says what to train; some of it means something only on the machine that runs it:
``[run].device = "auto"``, ``[deepspeed].precision = "auto"`` and the master weights it allows, the
parallel layout of ``[parallel].sp_size`` over the launched world. The training set-up resolves these
here, in one call, with the checks that need the world size (``RunConfig.validate``), and then reads
the ``ResolvedRun`` it gets: the checkpoints (their shape, the resume check, the run's record), the
DeepSpeed config, the FLOPs count and the start-up summary all see the same values, and the set-up
never goes back to the schema for them. What needs the tokenizer the data preparation made is checked
here too, once it exists (``ResolvedRun.check_tokenizer_vocab``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from plsh_dist.config.schema import RunConfig, resolve_master_weights, resolve_precision
from plsh_dist.distributed import ParallelDims


def resolve_device(name: str) -> torch.device:
    """``[run].device`` on this process: ``cuda`` (this rank's LOCAL_RANK device), ``cpu``, or ``auto``
    (CUDA when visible); ValueError for ``cuda`` without a visible device."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("[run].device = \"cuda\" but no CUDA device is visible; use \"cpu\" or \"auto\"")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


@dataclass(frozen=True)
class ResolvedRun:
    """One process's run: the config (never modified) and what it resolves to on this world and device."""

    cfg: RunConfig
    device: torch.device
    world: int
    """Ranks in the run (the launched world size)."""
    rank: int
    dims: ParallelDims
    """The DP x SP layout of the world (``[parallel].sp_size``)."""
    precision: str
    """"bf16" or "fp32": ``[deepspeed].precision`` on this device ("auto": bf16 on CUDA only)."""
    master_weights: str
    """"bf16" or "fp32": the dtype the optimizer updates (fp32 whenever the run is fp32)."""
    record: dict = field(repr=False, compare=False)
    """The config's TOML tables (``RunConfig.to_dict``), taken once: what the resume check compares with
    a checkpoint's and what the run writes as its record (``write_resolved``, record.py). Read only."""

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.run.out_dir)

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over the world: micro batch x accumulation x DP x sequence."""
        cfg = self.cfg
        return cfg.data.micro_batch_size * cfg.optim.grad_accum_steps * self.dims.dp_size * cfg.data.seq_len

    def check_tokenizer_vocab(self, tokenizer_vocab: int) -> None:
        """ValueError naming the fields when the tokenizer (trained or replaced since the config was
        loaded: the set-up calls this once the data preparation has it, before the model is built) has
        more pieces than the resolved [model].vocab_size (the model config's own check)."""
        cfg = self.cfg
        cfg.model.check_vocab_covers(
            tokenizer_vocab, cfg.tokenizer.model_path,
            fix=f"[model].vocab_size was resolved when the config was loaded (if unset: the vocabulary of the "
                f"file at [tokenizer].model_path, else [tokenizer].vocab_size) and the tokenizer has changed "
                f"since; set [model].vocab_size >= {tokenizer_vocab} (or [tokenizer].vocab_size = "
                f"{tokenizer_vocab}) and start again")


def resolve_run(cfg: RunConfig, world: int, device: torch.device, rank: int = 0) -> ResolvedRun:
    """``cfg`` on ``world`` ranks of ``device`` (this process: ``rank``): the checks that need the world
    size (``RunConfig.validate``), the precision, the master weights, the parallel layout and the
    config's tables (its record), once.

    Raises the config's ValueError (naming the field and the fix) for a layout or precision this
    world and device cannot run (e.g. ``master_weights = "bf16"`` with ``precision = "auto"`` on a CPU)."""
    cfg.validate(world_size=world)
    return ResolvedRun(cfg=cfg, device=device, world=world, rank=rank, dims=ParallelDims(world, cfg.parallel.sp_size),
                       precision=resolve_precision(cfg.deepspeed, device.type),
                       master_weights=resolve_master_weights(cfg.deepspeed, device.type), record=cfg.to_dict())
