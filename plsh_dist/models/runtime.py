"""The seed context: where the attention's hash seeds come from.

One :class:`AttentionRuntime` is shared by every attention module of a model (held by each
module's binding). It holds the run's seed and the (step, micro-step) whose masks the coming
forward draws, ``seed(layer) = hash_seed(run_seed, step, micro_step, layer)``; nothing else.
Whoever owns a step selects it scoped, and leaving restores the step found (``set_step`` sets
it unscoped):

    with runtime.at(step, micro_step):     # the trainer, per micro-step
        loss = forward(batch); loss.backward()
    with runtime.at(eval_seed_step):       # validation: its own fixed masks
        ...
    with runtime.at(window_index):         # evaluation: fresh masks per window
        ...

Why a context rather than an argument of the forward (transformers, ``generate()``, DeepSpeed and
checkpointing's recomputation carry no seed), and what the seeding guarantees (fresh masks per
step, micro-step and layer; resume, SP ranks and recomputation see the same masks;
``fixed_masks``): docs/design.md, section 2. Parallelism is never carried here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from plsh_dist.splitmix import hash_seed

__all__ = ["AttentionRuntime", "hash_seed"]

@dataclass
class AttentionRuntime:
    """The seed context every attention module of a model shares (one object).

    The trainer keeps a reference (``get_runtime(model)``) and enters
    ``at(step, micro_step)`` around each micro-step's forward and backward.
    """

    run_seed: int = 0
    """The run's seed (config); evaluation passes its own."""
    step: int = 0
    """Optimizer step of the coming forward."""
    micro_step: int = 0
    """Gradient-accumulation micro-step within ``step``."""
    steps: torch.Tensor = field(init=False, repr=False, compare=False)
    """``(step, micro_step)`` as a LongTensor[2], kept equal to them (written in place): what a compiled
    graph reads (:meth:`layer_seed_tensor`), as an input rather than a constant of the graph. On the
    CPU unless :meth:`keep_steps_on` moved it."""

    def __post_init__(self) -> None:
        self.steps = torch.zeros(2, dtype=torch.int64)
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
        self.steps.copy_(torch.tensor([step, micro_step]), non_blocking=self.steps.device.type != "cpu")

    def keep_steps_on(self, device: torch.device) -> None:
        """Keep :attr:`steps` on ``device`` (a GPU): the layer seeds are then computed there from it
        (``plsh_dist::layer_seed``), so a step captured in a CUDA graph reads the step it replays at
        from device memory, which :meth:`set_step` updates in place."""
        self.steps = self.steps.to(device)

    @contextlib.contextmanager
    def at(self, step: int, micro_step: int = 0) -> Iterator["AttentionRuntime"]:
        """Select the masks of (``step``, ``micro_step``) inside the ``with`` block (its forwards
        and their backwards); the step found on entry is restored on exit."""
        saved = (self.step, self.micro_step)
        self.set_step(step, micro_step)
        try:
            yield self
        finally:
            self.set_step(*saved)

    @contextlib.contextmanager
    def replaying(self, step: int, micro_step: int) -> Iterator["AttentionRuntime"]:
        """The eager recompute of a checkpointed layer (``plsh_dist.models.activation_checkpoint``) run
        in a backward at another step: :meth:`layer_seed` reads (``step``, ``micro_step``) inside. Unlike
        :meth:`at` it leaves :attr:`steps` alone: no tensor op may run there that the forward did not
        (selective checkpointing replays the forward's ops), and only a compiled graph reads it."""
        saved = (self.step, self.micro_step)
        self.step, self.micro_step = step, micro_step
        try:
            yield self
        finally:
            self.step, self.micro_step = saved

    def layer_seed(self, layer: int, fixed_masks: bool = False) -> int:
        """Hash seed of ``layer`` for the current (step, micro_step); with
        ``fixed_masks`` the seed of (step 0, micro-step 0) whatever the step."""
        if fixed_masks:
            return hash_seed(self.run_seed, 0, 0, layer)
        return hash_seed(self.run_seed, self.step, self.micro_step, layer)

    def layer_seed_tensor(self, layer: torch.Tensor, fixed_masks: bool = False) -> torch.Tensor:
        """:meth:`layer_seed` of ``layer`` (an int64 scalar tensor) as an int64 scalar tensor, by the op
        ``plsh_dist::layer_seed`` from :attr:`steps` (``fixed_masks``: from zeros), so ``torch.compile``
        bakes neither the step nor the layer into a graph."""
        from plsh_dist.ops.custom_ops import layer_seed, signed64

        steps = torch.zeros(2, dtype=torch.int64, device=self.steps.device) if fixed_masks else self.steps
        return layer_seed(steps, signed64(self.run_seed), layer)
