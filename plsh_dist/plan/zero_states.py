"""Parameters, gradients and optimizer states per rank, per ZeRO stage, as DeepSpeed keeps them.

The trainer hands ``torch.optim.AdamW`` to DeepSpeed (``plsh_dist/train/optim.py``), which wraps it
by precision and stage (``DeepSpeedEngine._do_optimizer_sanity_check``); this module counts what
each wrapper allocates (DeepSpeed 0.19.x), reading DeepSpeed's defaults (bucket sizes,
overlap_comm) from the installed DeepSpeed. The wrapper by wrapper account (ZeRO 0-3, bf16 / fp32,
offload): docs/memory.md, "What DeepSpeed keeps per rank".
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StateBytes:
    """Per-rank device bytes of weights, gradients and optimizer states, by when they exist."""

    wrapper: str
    """The DeepSpeed optimizer wrapping AdamW."""
    weights: int
    """Model parameters in their dtype (ZeRO 3: the partition + the gathered working set)."""
    master: int
    """Master weights (fp32, or bf16 under master_weights = "bf16")."""
    optimizer: int
    """AdamW's exp_avg and exp_avg_sq in the masters' dtype (created by the first step, kept)."""
    grad_buffers: int
    """Gradient buffers allocated with the optimizer and kept (ZeRO 3's partition and
    bucket, BF16_Optimizer's fp32 accumulator)."""
    buckets: int
    """Reduction buffers set up when backward starts and released by the step."""
    grads: int
    """Gradients built up during backward, complete at the step (freed after it)."""
    step_temp: int
    """What the step adds: the gradients' copy in the masters' dtype (ZeRO 0 bf16, ZeRO 1/2; fused
    AdamW adds nothing)."""
    cpu: int = 0
    """Bytes kept in CPU memory instead (offload_optimizer)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def at_forward(self) -> int:
        return self.weights + self.master + self.optimizer + self.grad_buffers

    @property
    def at_backward(self) -> int:
        """Without the gradients still to come (the moments that matter come early in backward)."""
        return self.at_forward + self.buckets

    @property
    def at_step(self) -> int:
        return self.at_backward + self.grads + self.step_temp

    @property
    def total(self) -> int:
        """Every state at once (the step's view)."""
        return self.at_step


def deepspeed_defaults(stage: int) -> dict[str, int | bool]:
    """The installed DeepSpeed's defaults that size its buffers."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = DeepSpeedZeroConfig(stage=stage)
    fallback = inspect.signature(DeepSpeedEngine.buffered_allreduce_fallback).parameters["elements_per_buffer"]
    return {"reduce_bucket_size": int(zero.reduce_bucket_size), "overlap_comm": bool(zero.overlap_comm),
            "prefetch_bucket_size": int(zero.prefetch_bucket_size), "allreduce_elements": int(fallback.default)}


def state_bytes(*, params: int, largest_module: int, stage: int, precision: str, world: int,
                offload_optimizer: bool = False, master_weights: str = "fp32") -> StateBytes:
    """``StateBytes`` of one rank (module doc). ``precision``: "bf16" or "fp32";
    ``master_weights``: "fp32" or "bf16" (bf16 runs only, as the config resolves it)."""
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")
    ds = deepspeed_defaults(stage)
    n, w = params, world
    part = -(-n // w)  # ceil(N / W)
    b = 2 if precision == "bf16" else 4
    m = 2 if precision == "bf16" and master_weights == "bf16" else 4
    if stage == 0:
        buckets = min(n, ds["allreduce_elements"]) * b if w > 1 else 0
        if precision == "bf16":
            return StateBytes("FP16_UnfusedOptimizer (DeepSpeed's bf16 without ZeRO)", weights=2 * n, master=4 * n,
                              optimizer=8 * n, grad_buffers=0, buckets=buckets, grads=2 * n, step_temp=4 * n)
        return StateBytes("none (torch AdamW on the parameters)", weights=b * n, master=0, optimizer=8 * n,
                          grad_buffers=0, buckets=buckets, grads=b * n, step_temp=0)
    master, optimizer = m * part, 2 * m * part
    if stage == 1 and precision == "bf16" and m == 4 and not offload_optimizer:
        wrapper, weights, grad_buffers, buckets, grads, temp = "BF16_Optimizer", 2 * n, 4 * n, 0, 0, 0
        offloaded = 0
    elif stage in (1, 2):
        wrapper, weights, grad_buffers = "DeepSpeedZeroOptimizer", b * n, 0
        buckets = ds["reduce_bucket_size"] * b * (2 if ds["overlap_comm"] else 1)
        grads, temp, offloaded = b * part, m * part, m * part
    else:
        wrapper = "DeepSpeedZeroOptimizer_Stage3"
        working = min(n, largest_module + ds["prefetch_bucket_size"])
        weights = b * part + b * working
        grad_buffers, buckets, grads, temp = m * part + ds["reduce_bucket_size"] * b, 0, 0, 0
        offloaded = m * part
    cpu = 0
    if offload_optimizer:
        cpu = master + optimizer + offloaded
        if stage == 3:
            grad_buffers -= offloaded
        master = optimizer = temp = 0
    return StateBytes(wrapper, weights=weights, master=master, optimizer=optimizer, grad_buffers=grad_buffers,
                      buckets=buckets, grads=grads, step_temp=temp, cpu=cpu)


def checkpoint_bytes(*, params: int, stage: int, precision: str, master_weights: str = "fp32") -> int:
    """Bytes of one DeepSpeed checkpoint tag, every rank's files together (the partitions add up
    to the whole whatever the world size): the module's weights in their dtype (none under ZeRO-3,
    whose module file holds placeholders), the master weights (fp32, or bf16 under master_weights
    = "bf16"; none in an fp32 run without ZeRO, whose weights are the masters) and AdamW's two
    moments in the masters' dtype. The files' own overhead (names, pickle framing) comes on top,
    a few dozen bytes per tensor. On the debug model (853,376 parameters) the files held 12.0 (fp32
    ZeRO 0 and 3), 16.0 (fp32 ZeRO 1), 14.1 (bf16 ZeRO 0 and 1), 12.0 (bf16 ZeRO 3) and 8.1 (bf16
    masters, ZeRO 2) bytes per parameter; tests/train/test_disk_full.py checks one against a save."""
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")
    n = params
    b = 2 if precision == "bf16" else 4
    m = 2 if precision == "bf16" and master_weights == "bf16" else 4
    weights = 0 if stage == 3 else b * n
    if stage == 0:
        return weights + (8 * n if precision == "fp32" else 12 * n)
    return weights + 3 * m * n
