"""Per-forward state of the attention: where the hash seeds come from.

Seeding choice (documented here, relied on by training and evaluation):

    seed(layer) = hash_seed(run_seed, step, micro_step, layer)

- **fresh masks every forward**: each optimizer step, each gradient-
  accumulation micro-step and each layer gets its own hash draw, so training
  averages over masks instead of fitting one fixed set of blocks;
- **reproducible**: the seed is a pure function of four integers (SplitMix64
  mixing, never Python's salted ``hash``), so a resumed run replays exactly
  the same masks, every sequence-parallel rank derives the same block
  boundaries without communicating, and activation checkpointing's
  recomputation sees the forward's masks (as long as the step is not
  changed between a forward and its backward);
- ``AttentionConfig.fixed_masks=True`` pins (step, micro_step) to (0, 0):
  one mask set per layer for the whole run;
- evaluation builds ``AttentionRuntime(run_seed=<eval seed>)`` and either
  keeps step 0 or calls ``set_step(batch_index)`` for fresh masks per batch.

Model code knows nothing of parallelism: sequence parallelism is bound to
the attention modules once (:func:`plsh_dist.distributed.sp.apply_sequence_parallel`),
never carried here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plsh_dist.splitmix import MASK64, splitmix64_int

__all__ = ["AttentionRuntime", "hash_seed"]

def hash_seed(run_seed: int, step: int, micro_step: int, layer: int) -> int:
    """Seed of one layer's hash in one forward, an int in [0, 2^63).

    A chained SplitMix64 of (run_seed, step, micro_step, layer): the same
    inputs give the same seed on every machine and Python process; changing
    any one input gives an unrelated seed. 63 bits so it fits a signed
    int64 (torch generators, numpy) as well as the hash's uint64 key.
    """
    for name, value in (("step", step), ("micro_step", micro_step), ("layer", layer)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if isinstance(run_seed, bool) or not isinstance(run_seed, int):
        raise ValueError(f"run_seed must be an int, got {run_seed!r}")
    key = splitmix64_int(run_seed & MASK64)
    for value in (step, micro_step, layer):
        key = splitmix64_int(key ^ value)
    return key >> 1


@dataclass
class AttentionRuntime:
    """Mutable state every attention module of a model shares (one object).

    The trainer keeps a reference (``get_runtime(model)``) and calls
    ``set_step(step, micro_step)`` before each forward.
    """

    run_seed: int = 0
    """The run's seed (config); evaluation passes its own."""
    step: int = 0
    """Optimizer step of the coming forward."""
    micro_step: int = 0
    """Gradient-accumulation micro-step within ``step``."""
    positions_cache: Any = field(default=None, init=False, repr=False, compare=False)
    """((position_ids, version), (cu_seq_lens, version)) of the current forward and the ops'
    (positions, cu_seqlens) made from them; internal to the attention function (one
    device-to-host copy per forward)."""

    def __post_init__(self) -> None:
        if isinstance(self.run_seed, bool) or not isinstance(self.run_seed, int):
            raise ValueError(f"run_seed must be an int, got {self.run_seed!r}")
        self.set_step(self.step, self.micro_step)

    def set_step(self, step: int, micro_step: int = 0) -> None:
        """Select the masks of the coming forward (and its backward)."""
        for name, value in (("step", step), ("micro_step", micro_step)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.step = step
        self.micro_step = micro_step

    def layer_seed(self, layer: int, fixed_masks: bool = False) -> int:
        """Hash seed of ``layer`` for the current (step, micro_step); with
        ``fixed_masks`` the seed of (step 0, micro-step 0) whatever the step."""
        if fixed_masks:
            return hash_seed(self.run_seed, 0, 0, layer)
        return hash_seed(self.run_seed, self.step, self.micro_step, layer)
