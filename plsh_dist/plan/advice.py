"""Does a plan fit the device, and if not, which config changes make it fit.

A run *fits* when its estimated peak stays under ``HEADROOM`` (90%) of the
device's memory: the estimate counts tensors, while PyTorch's caching
allocator fragments, and the CUDA context and NCCL's buffers take their
share of the rest.

Changes are tried cumulatively, cheapest first, each kept only when it
lowers the peak: the chunked loss (one extra LM-head matmul), activation
checkpointing (one extra forward of the layers; from selective, full), the next ZeRO stage (more
communication), doubling sp_size while it divides the world and seq_len
(more ranks per sequence), halving micro_batch_size while doubling
grad_accum_steps (same tokens per step, more, smaller steps), and
offloading the optimizer to CPU memory (slower steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from plsh_dist.config.schema import apply_overrides, config_from_table, parse_overrides
from plsh_dist.plan.estimate import Plan, plan_run

HEADROOM = 0.9


def fits(plan: Plan, device_bytes: int) -> bool:
    return plan.memory.peak <= HEADROOM * device_bytes


@dataclass(frozen=True)
class Advice:
    """The changes tried, in order, and the plan they lead to."""

    changes: list[str]
    """``--section.key=value`` overrides, in the order first applied (each key once, its last value)."""
    plan: Plan
    fits: bool


def _with(cfg, overrides: list[str]):
    return config_from_table(apply_overrides(cfg.to_dict(), parse_overrides(overrides)))


def _candidates(cfg, world: int):
    """Yield one override at a time for the current ``cfg`` (module doc's order)."""
    mem, ds, data, par, optim = cfg.memory, cfg.deepspeed, cfg.data, cfg.parallel, cfg.optim
    if not mem.loss_chunk_tokens:
        yield "--memory.loss_chunk_tokens=2048"
    if not mem.activation_checkpointing:
        yield "--memory.activation_checkpointing=true"
    elif mem.activation_checkpointing_mode != "full":
        yield "--memory.activation_checkpointing_mode=full"
    if ds.zero_stage < 3:
        yield f"--deepspeed.zero_stage={ds.zero_stage + 1}"
    sp = par.sp_size * 2
    if world % sp == 0 and data.seq_len % sp == 0:
        yield f"--parallel.sp_size={sp}"
    if data.micro_batch_size > 1 and data.micro_batch_size % 2 == 0:
        yield [f"--data.micro_batch_size={data.micro_batch_size // 2}",
               f"--optim.grad_accum_steps={optim.grad_accum_steps * 2}"]
    if ds.zero_stage >= 1 and not ds.offload_optimizer:
        yield "--deepspeed.offload_optimizer=true"


def advise(cfg, plan: Plan, device_bytes: int, *, world_size: int) -> Advice:
    """Apply ``_candidates`` one by one until the plan fits (or none is left)."""
    changes: list[str] = []
    while not fits(plan, device_bytes):
        for change in _candidates(cfg, world_size):
            step = change if isinstance(change, list) else [change]
            trial_cfg = _with(cfg, step)
            trial = plan_run(trial_cfg, world_size=world_size, device=plan.device)
            if trial.memory.peak < plan.memory.peak:
                cfg, plan = trial_cfg, trial
                keys = {c.split("=", 1)[0] for c in step}
                changes = [c for c in changes if c.split("=", 1)[0] not in keys] + step
                break
        else:
            break  # nothing left lowers the peak
    return Advice(changes=changes, plan=plan, fits=fits(plan, device_bytes))
