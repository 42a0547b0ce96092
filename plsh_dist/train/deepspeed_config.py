"""Generate the DeepSpeed config dict from our run config (one source of truth).

The optimizer and the LR schedule are torch objects handed to
``deepspeed.initialize`` (``optim.py``), not DeepSpeed JSON entries: DeepSpeed's
own Adam variants compile C++ ops on first use (minutes, and they may fail on
a machine without a compiler), while ``torch.optim.AdamW`` works everywhere.
"""

from __future__ import annotations

from typing import Any

from plsh_dist.config.schema import DeepSpeedSection, OptimSection


def deepspeed_config(
    ds: DeepSpeedSection, optim: OptimSection, *, micro_batch_size: int, device_type: str,
    precision: str, master_weights: str, load_universal: bool = False,
) -> dict[str, Any]:
    """The dict passed as ``deepspeed.initialize(config=...)``.

    Args:
        ds: [deepspeed] section.
        optim: [optim] section (grad accumulation, clipping).
        micro_batch_size: sequences per micro-batch per rank ([data].micro_batch_size).
        device_type: "cpu" or "cuda" (pinned memory for an offloaded optimizer on CUDA).
        precision, master_weights: "bf16" or "fp32" as resolved once for the run's device (the
            training set-up's ``ResolvedRun``: ``[deepspeed].precision = "auto"`` is not read here).
        load_universal: the run resumes from DeepSpeed's universal checkpoint (a resume at
            another shape: checkpoint/run_shape.py).
    DeepSpeed derives ``train_batch_size = micro x accum x world_size`` itself.
    """
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.zero_stage >= 1 and ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": device_type == "cuda"}
    if ds.zero_stage == 3:
        # Export needs the full weights gathered on save (see plsh_dist/checkpoint/export.py).
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": optim.grad_accum_steps,
        "gradient_clipping": optim.grad_clip,
        "zero_optimization": zero,
        "bf16": _bf16_section(precision, master_weights),
        "fp16": {"enabled": False},
        # We log ourselves (metrics.jsonl, tensorboard); silence DeepSpeed's per-step prints.
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        # A torch optimizer is "untested" for ZeRO in DeepSpeed's eyes; AdamW is fine.
        "zero_allow_untested_optimizer": True,
    }
    if precision == "bf16" and master_weights == "fp32" and ds.zero_stage >= 1:
        # Accumulate and reduce gradients in fp32 for bf16 weights. Without ZeRO, DeepSpeed refuses
        # that mix (NotImplementedError in _do_optimizer_sanity_check); it then keeps fp32 master
        # weights (its DDP bf16 optimizer) but accumulates and all-reduces the gradients in bf16.
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if load_universal:
        config["checkpoint"] = {"load_universal": True}
    return config


def _bf16_section(precision: str, master_weights: str) -> dict[str, Any]:
    """DeepSpeed's ``bf16`` entry. bf16 master weights: the optimizer's partitions, gradients and
    AdamW moments stay bf16 (``bf16_optimizer_states`` keeps them off DeepSpeed's CPU-Adam route)."""
    section: dict[str, Any] = {"enabled": precision == "bf16"}
    if precision == "bf16" and master_weights == "bf16":
        section.update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    return section
