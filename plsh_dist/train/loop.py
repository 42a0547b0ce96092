"""The pretraining loop: DeepSpeed engine, SP x DP, logging, checkpoints, export.

Gradient math under sequence parallelism (why the local loss is scaled by sp_size)
--------------------------------------------------------------------------------
The non-parallel loss of a micro-batch is the mean token loss of its whole
sequences, ``L = sum_tokens l / N``. Under SP each rank holds a chunk and sums
its own token losses ``S_r``; ``L = sum_{r in SP group} S_r / N``, where ``N``
counts the tokens of the whole SP group (all-reduced, so ignored labels are
handled). Gradients that cross ranks through the attention's halo exchange
are sent back in backward, so summing every rank's parameter gradient over the
SP group gives ``dL`` exactly.

DeepSpeed averages gradients over all ``world = dp x sp`` ranks (we pass no
``mpu``: every rank is a "data-parallel" rank to DeepSpeed). Each rank
therefore back-propagates ``sp_size * S_r / N``, and the average over the
world is ``(1/dp) sum_dp (1/sp) sum_sp sp * S_r / N = mean_dp L`` — the
non-parallel gradient of the global batch. Why not an ``mpu`` with the DP
group: ZeRO would then shard only over DP and keep a full copy per SP rank,
and we would still need a separate SP sum-reduction of the gradients; letting
DeepSpeed see the whole world shards optimizer state (and params, ZeRO-3)
``world``-ways for free. Gradient clipping sees the averaged gradient, so the
norm equals the non-parallel run's (tested).

The logged loss is ``sum S / sum N`` all-reduced over the world: the true mean
token loss of the global batch, whatever the layout.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from plsh_dist.distributed import ParallelDims, default_backend
from plsh_dist.ops import comm_stats
from plsh_dist.train.checkpoint import find_resume, load_checkpoint, save_checkpoint
from plsh_dist.train.config import RunConfig, write_resolved
from plsh_dist.train.data_setup import DataPipeline, prepare
from plsh_dist.train.deepspeed_config import deepspeed_config, resolve_precision
from plsh_dist.train.export import export_final
from plsh_dist.train.faults import maybe_fail
from plsh_dist.train.logging import MetricsLogger, memory_mb, mfu, startup_summary
from plsh_dist.train.optim import build_optimizer, build_scheduler

__all__ = ["TrainResult", "train", "resolve_device", "init_distributed", "token_loss_sums", "validation_loss"]

# Peak dense bf16 FLOP/s for MFU when the GPU is not recognised (H100 SXM).
_DEFAULT_PEAK_FLOPS = 989e12


@dataclass
class TrainResult:
    """What ``train`` returns (on every rank; values are global)."""

    losses: list[float] = field(default_factory=list)
    """Logged loss of every optimizer step run in this call (true global mean)."""
    grad_norms: list[float] = field(default_factory=list)
    """Global gradient norm before clipping, per step."""
    first_step: int = 0
    """Step this call started from (> 0 after a resume)."""
    val_loss: float | None = None
    out_dir: str = ""
    final_dir: str | None = None


def resolve_device(name: str) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("[run].device = \"cuda\" but no CUDA device is visible; use \"cpu\" or \"auto\"")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_distributed(device: torch.device, timeout_s: int = 600) -> None:
    """Join the launcher's process group (env:// from deepspeed/torchrun), or a
    1-process group when started as plain ``python``; no-op when already up.

    ``timeout_s``: how long a collective waits for a missing peer before it
    raises ([parallel].timeout_s), so a dead or hung rank ends the job."""
    if dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed

    deepspeed.init_distributed(dist_backend=default_backend(device), timeout=timedelta(seconds=timeout_s))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token_loss_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of token cross-entropies (fp32) and the number of counted tokens.

    logits (B, T_local, V); labels (B, T_local), -100 = ignored.
    """
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    return loss_sum, (labels != -100).sum()


def _forward_sums(model, batch: dict[str, torch.Tensor], device: torch.device):
    out = model(input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device))
    return token_loss_sums(out.logits, batch["labels"].to(device))


def _sp_token_count(n_local: torch.Tensor, sp_group) -> torch.Tensor:
    n = n_local.detach().to(torch.float64).clone()
    if sp_group is not None:
        dist.all_reduce(n, group=sp_group)
    return n


@torch.no_grad()
def validation_loss(model, batches, runtime, device: torch.device, eval_seed_step: int = 0) -> float:
    """Mean token loss over ``batches`` (this rank's shard), all-reduced over the world.

    The attention masks of evaluation use step ``eval_seed_step`` so that every
    evaluation of a run (and of a resumed run) sees the same masks.
    """
    saved = (runtime.step, runtime.micro_step)
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in batches:
        runtime.set_step(eval_seed_step, 0)
        loss_sum, n = _forward_sums(model, batch, device)
        sums += torch.stack([loss_sum.double(), n.double()])
    if dist.is_initialized():
        dist.all_reduce(sums)
    runtime.set_step(*saved)
    model.train(was_training)
    return (sums[0] / sums[1].clamp(min=1)).item()


def _grad_norm(engine) -> float:
    """Global L2 norm of the (averaged, unclipped) gradient."""
    norm = engine.get_global_grad_norm()
    if norm is None:
        # ZeRO 0: DeepSpeed has averaged p.grad at the boundary but keeps no norm.
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    return float(norm)


def _comm_bytes() -> float:
    """Halo / all-gather bytes this process has sent and received so far."""
    stats = comm_stats()
    return float(stats["sent_bytes"] + stats["recv_bytes"])


def train(cfg: RunConfig, *, stop_after: int | None = None) -> TrainResult:
    """Run (or resume) the pretraining described by ``cfg``; collective over all ranks.

    ``stop_after``: leave after that optimizer step as a preempted job would,
    with a checkpoint of that step and no final evaluation or export (for
    time-limited allocations, and to test that resuming replays the run).
    """
    import deepspeed

    from plsh_dist.models import AttentionRuntime, build_model, count_parameters

    device = resolve_device(cfg.run.device)
    init_distributed(device, cfg.parallel.timeout_s)
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg.validate(world_size=world)
    dims = ParallelDims(world, cfg.parallel.sp_size)
    sp_group, _dp_group = dims.build_groups(timeout=timedelta(seconds=cfg.parallel.timeout_s))
    sp_rank, dp_rank = dims.sp_rank(rank), dims.dp_rank(rank)
    precision = resolve_precision(cfg.deepspeed, device.type)

    prepared = prepare(cfg.data, cfg.tokenizer)
    tokenizer, tokenizer_path = prepared.tokenizer, cfg.tokenizer.model_path
    cfg.check_tokenizer_vocab(tokenizer.vocab_size)  # a tokenizer trained or replaced since load_config
    model_cfg, attn_cfg = cfg.model_configs(tokenizer.vocab_size)
    # Resolve [model]/[attention] into full tables so the written config says everything.
    cfg.model, cfg.attention = model_cfg.to_dict(), attn_cfg.to_dict()
    out_dir = Path(cfg.run.out_dir)
    if rank == 0:
        write_resolved(cfg, out_dir)

    data = DataPipeline(prepared, cfg.data, dp_rank=dp_rank, dp_size=dims.dp_size,
                        sp_rank=sp_rank, sp_size=dims.sp_size)

    torch.manual_seed(cfg.run.seed)  # identical init on every rank
    runtime = AttentionRuntime(run_seed=cfg.run.seed, sp_group=sp_group)
    model = build_model(model_cfg, attn_cfg, runtime, device=device)
    n_params = count_parameters(model)
    if cfg.deepspeed.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = build_optimizer(model, cfg.optim, device.type)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.run.max_steps)
    ds_config = deepspeed_config(cfg.deepspeed, cfg.optim, micro_batch_size=cfg.data.micro_batch_size,
                                 device_type=device.type)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_config, dist_init_required=False)

    start_step = 0
    resume = find_resume(cfg.checkpoint.resume, out_dir)
    if resume is not None:
        state = load_checkpoint(engine, *resume)
        start_step = int(state["step"])
    gas = cfg.optim.grad_accum_steps
    data.skip_to(start_step * gas)  # replay exactly the batches a continuous run would see

    tokens_per_step = cfg.data.micro_batch_size * gas * dims.dp_size * cfg.data.seq_len
    log = MetricsLogger(out_dir, enabled=rank == 0, tensorboard=cfg.logging.tensorboard,
                        progress=cfg.logging.progress, total_steps=cfg.run.max_steps, initial_step=start_step)
    # A fresh run starts a fresh metrics.jsonl; a resumed one drops what the
    # interrupted run logged after its checkpoint (those steps are replayed).
    log.truncate_after(start_step)
    log.print(startup_summary({
        "run": f"{cfg.run.name} -> {out_dir}",
        "model": f"{model_cfg.family} L={model_cfg.num_layers} H={model_cfg.hidden_size} "
                 f"heads={model_cfg.num_heads}/{model_cfg.num_kv_heads} vocab={model_cfg.vocab_size}",
        "parameters": f"{n_params:,}",
        "attention": f"bias={attn_cfg.bias} rope={attn_cfg.rope} samples={attn_cfg.num_samples} "
                     f"sigma={attn_cfg.sigma if attn_cfg.sigma is not None else 'per-head 1/alibi_slope'}",
        "layout": f"{dims.describe()} (SP groups {dims.sp_group_ranks()})",
        "tokens/step": f"{tokens_per_step:,} = micro {cfg.data.micro_batch_size} x accum {gas} x dp "
                       f"{dims.dp_size} x seq {cfg.data.seq_len} (each rank {cfg.data.seq_len // dims.sp_size} tokens)",
        "engine": f"DeepSpeed ZeRO-{cfg.deepspeed.zero_stage}, {precision}, device {device}, "
                  f"act-ckpt {cfg.deepspeed.activation_checkpointing}",
        "steps": f"{start_step} -> {cfg.run.max_steps}" + (f" (resumed from {resume[0] / resume[1]})" if resume else ""),
    }))

    result = TrainResult(first_step=start_step, out_dir=str(out_dir))
    sp_scale = float(dims.sp_size)
    engine.train()
    last_t, comm_prev = time.time(), _comm_bytes()
    for step in range(start_step, cfg.run.max_steps):
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, tokens, comm bytes
        lr = engine.get_lr()[0]  # the rate this step's update uses
        grad_norm = float("nan")
        for micro in range(gas):
            runtime.set_step(step, micro)
            batch = data.next_train()
            loss_sum, n_local = _forward_sums(engine, batch, device)
            n_group = _sp_token_count(n_local, sp_group)
            engine.backward(loss_sum * (sp_scale / n_group.to(loss_sum.dtype)))
            if micro == gas - 1 and cfg.deepspeed.zero_stage == 0:
                grad_norm = _grad_norm(engine)
            engine.step()
            sums[0] += loss_sum.detach().double()
            sums[1] += n_local.double()
        if cfg.deepspeed.zero_stage > 0:
            grad_norm = _grad_norm(engine)
        comm_now = _comm_bytes()
        sums[2] = comm_now - comm_prev
        comm_prev = comm_now
        dist.all_reduce(sums)
        loss = (sums[0] / sums[1]).item()
        now = time.time()
        tokens_per_s = tokens_per_step / max(now - last_t, 1e-9)
        last_t = now
        result.losses.append(loss)
        result.grad_norms.append(grad_norm)
        done = step + 1
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {done}; lower [optim].lr or check the data")

        if done % cfg.logging.every_steps == 0 or done in (start_step + 1, cfg.run.max_steps):
            metrics: dict[str, Any] = {
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens_per_s": tokens_per_s,
                "halo_bytes": sums[2].item(),
                "memory_mb": memory_mb(device),
            }
            if device.type == "cuda":
                metrics["mfu"] = mfu(tokens_per_s, n_params, model_cfg.num_layers, model_cfg.hidden_size,
                                     cfg.data.seq_len, world, _DEFAULT_PEAK_FLOPS)
            if cfg.logging.eval_every and done % cfg.logging.eval_every == 0 and done != cfg.run.max_steps:
                metrics["val_loss"] = validation_loss(engine, data.val_batches(cfg.logging.eval_batches), runtime, device)
            log.log(done, metrics)
        elif cfg.logging.eval_every and done % cfg.logging.eval_every == 0 and done != cfg.run.max_steps:
            log.log(done, {"val_loss": validation_loss(engine, data.val_batches(cfg.logging.eval_batches), runtime, device)})
        log.advance(1, {"loss": f"{loss:.3f}", "tok/s": f"{tokens_per_s:.0f}"})

        periodic = cfg.checkpoint.every_steps and done % cfg.checkpoint.every_steps == 0
        stopping = stop_after is not None and done >= stop_after and done != cfg.run.max_steps
        if (periodic or stopping) and done != cfg.run.max_steps:
            save_checkpoint(engine, cfg, done, {"step": done, "consumed_micro_batches": done * gas, "loss": loss},
                            tokenizer_path)
        maybe_fail("after_step", done, rank)
        if stopping:
            log.print(f"stopped after step {done} (stop_after); resume with --resume auto")
            log.close()
            return result

    if start_step < cfg.run.max_steps or resume is None:
        done = cfg.run.max_steps
        if cfg.logging.eval_batches:
            result.val_loss = validation_loss(engine, data.val_batches(cfg.logging.eval_batches), runtime, device)
            log.log(done, {"val_loss": result.val_loss, "val_ppl": math.exp(min(result.val_loss, 50.0))})
            log.print(f"validation: loss {result.val_loss:.4f}  ppl {math.exp(min(result.val_loss, 50.0)):.2f}")
        save_checkpoint(engine, cfg, done, {"step": done, "consumed_micro_batches": done * gas,
                                            "loss": result.losses[-1] if result.losses else None}, tokenizer_path)
        if cfg.checkpoint.export_safetensors:
            result.final_dir = str(export_final(engine, cfg, tokenizer_path, out_dir / "final"))
    log.print(f"outputs: {out_dir} (metrics.jsonl, tensorboard/, checkpoints/, final/)")
    log.close()
    return result
