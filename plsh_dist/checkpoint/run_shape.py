"""What a resume may change about the cluster, and how: the same shards, DeepSpeed's universal checkpoint, or a refusal.

A run's **shape** is what lays its DeepSpeed state out on disk: the world size (DeepSpeed partitions
ZeRO states over every rank: this trainer gives it no ``mpu``), the ZeRO stage, the precision and
the master weights' dtype; with the SP size, which splits the world into data-parallel groups. The
trained function does not depend on it (resume_check.py holds what does), and the data order does
not either (one global stream, data/sampler.py). A resume at another shape:

- the same world size, stage, precision and master weights, at another SP size: the checkpoint's
  own files (DeepSpeed's layout does not see the SP split);
- at ZeRO 1-3 on both sides: through DeepSpeed's universal checkpoint (universal.py): any world
  size, SP size, stage, precision or master-weights dtype;
- at ZeRO 0 on both sides, with the same precision: the checkpoint's own files (nothing is
  partitioned: the full optimizer state is in the model-states file), at any world size;
- between ZeRO 0 and ZeRO 1-3, or across a precision change at ZeRO 0: refused, before any work.
  DeepSpeed's ``ds_to_universal`` reads ZeRO optimizer partitions, which a ZeRO 0 checkpoint has
  none of, its ZeRO 0 engine loads no universal checkpoint, and ZeRO 0 in bf16 keeps its fp32
  masters in another optimizer than fp32 runs.

The rules and the commands: docs/training.md, "Resume at another shape".
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from plsh_dist.config.resolved import ResolvedRun
from plsh_dist.config.schema import RunConfig, read_resolved, resolve_master_weights, resolve_precision

SAME_FILES = "same files"
UNIVERSAL = "universal"


@dataclass(frozen=True)
class RunShape:
    """How one run's DeepSpeed state is laid out (module doc)."""

    world_size: int
    sp_size: int
    zero_stage: int
    precision: str
    """"bf16" or "fp32", as resolved on the run's device."""
    master_weights: str
    """"bf16" or "fp32": the dtype the optimizer updates (fp32 whenever the run is fp32)."""

    @property
    def dp_size(self) -> int:
        return self.world_size // self.sp_size

    def engine_layout(self) -> tuple:
        """What DeepSpeed's files depend on: all but the SP size (DeepSpeed sees the world as one
        data-parallel group)."""
        return self.world_size, self.zero_stage, self.precision, self.master_weights

    def describe(self) -> str:
        weights = self.precision if self.precision == "fp32" else f"bf16 with {self.master_weights} master weights"
        return (f"world {self.world_size} (DP {self.dp_size} x SP {self.sp_size}), ZeRO {self.zero_stage}, "
                f"{weights}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, table: dict) -> "RunShape":
        return cls(**{f.name: table[f.name] for f in fields(cls)})

    @classmethod
    def of(cls, run: ResolvedRun) -> "RunShape":
        """The shape a resolved run (``plsh_dist.config.resolved``) trains at: its values, not resolved again."""
        return cls(world_size=run.world, sp_size=run.dims.sp_size, zero_stage=run.cfg.deepspeed.zero_stage,
                   precision=run.precision, master_weights=run.master_weights)


def run_shape(cfg: RunConfig, world_size: int, device_type: str) -> RunShape:
    """The shape ``cfg`` trains at on ``world_size`` ranks of ``device_type``."""
    return RunShape(world_size=world_size, sp_size=cfg.parallel.sp_size, zero_stage=cfg.deepspeed.zero_stage,
                    precision=resolve_precision(cfg.deepspeed, device_type),
                    master_weights=resolve_master_weights(cfg.deepspeed, device_type))


def saved_shape(tag_dir: str | Path, device_type: str) -> RunShape | None:
    """The shape checkpoint ``tag_dir`` was written at: its trainer state's ``shape``; for a checkpoint
    written before that was saved, its resolved config and the number of ZeRO partitions on disk
    (precision "auto" resolved on ``device_type``). None when neither can be read (the manifest check
    of ``load_checkpoint`` then names what is missing)."""
    tag_dir = Path(tag_dir)
    try:
        state = json.loads((tag_dir / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(state.get("shape"), dict):
        return RunShape.from_dict(state["shape"])
    if not (tag_dir / "config.resolved.json").is_file():
        return None
    saved = read_resolved(tag_dir)
    partitions = len(list(tag_dir.glob("*zero_pp_rank_*_mp_rank_00_optim_states.pt")))
    world = partitions or saved.parallel.sp_size  # ZeRO 0: the world size leaves no trace, nor does it matter
    return run_shape(saved, world, device_type)


def resume_route(saved: RunShape, now: RunShape, tag_dir: str | Path) -> str:
    """How a run at shape ``now`` loads checkpoint ``tag_dir`` written at ``saved``: ``SAME_FILES`` or
    ``UNIVERSAL``; ValueError (one line: the field, both values, the way out) where no route exists."""
    if saved.engine_layout() == now.engine_layout():
        return SAME_FILES  # another SP size over the same world: DeepSpeed's files are laid out alike
    if saved.zero_stage >= 1 and now.zero_stage >= 1:
        return UNIVERSAL
    if saved.zero_stage == now.zero_stage == 0 and saved.precision == now.precision:
        return SAME_FILES  # nothing partitioned: the same files at any world or SP size
    if saved.zero_stage != now.zero_stage:
        raise ValueError(
            f"cannot resume from {tag_dir}: [deepspeed].zero_stage = {now.zero_stage}, the checkpoint was written "
            f"at {saved.zero_stage}; DeepSpeed's universal checkpoint converts between ZeRO 1-3 only (a ZeRO 0 "
            "checkpoint holds no optimizer partitions to convert, and a ZeRO 0 engine loads none). Resume with "
            f"--deepspeed.zero_stage={saved.zero_stage} (at any number of ranks), or start a new run from the "
            "weights ([model].init_from; the AdamW moments start afresh)")
    raise ValueError(
        f"cannot resume from {tag_dir}: [deepspeed].precision = {now.precision!r}, the checkpoint was written in "
        f"{saved.precision!r} at ZeRO 0, whose optimizer state DeepSpeed cannot convert; resume with "
        f"--deepspeed.precision={saved.precision}, or at ZeRO 1-3 on both sides (the checkpoint's run is ZeRO 0), "
        "or start a new run from the weights ([model].init_from)")


def change_notice(saved: RunShape, now: RunShape) -> str:
    """The log line of a resume at another shape: what changes, and what it does to the numbers."""
    line = f"resume at another shape: {saved.describe()} -> {now.describe()}"
    if saved.master_weights == "fp32" and now.master_weights == "bf16":
        line += "; the fp32 master weights and AdamW moments are rounded to bf16"
    return line
