"""The pretraining loop: DeepSpeed engine, SP x DP, logging, checkpoints, export.

``train`` holds the run directory's lock for its whole call (rank 0, run_lock.py) around ``setup``
(device, process groups, data, model, engine, resume -> ``TrainSession``), which goes one way: the
config resolved for the world and device once (``resolve_run``, config/resolved.py), the run's
``CheckpointManager`` (checkpoint/manager.py: the resume found and checked, then loaded, and every
save and the export; the loop talks to nothing else in checkpoint/), then per optimizer step
``train_step`` (its micro-steps -> ``StepStats``), ``_log_step`` (metrics, periodic validation) and
``_save_checkpoint`` (periodic / stop), and at the end ``_finish`` (final validation, checkpoint,
``_export``).

Under SP each rank back-propagates ``sp_size * S_r / N`` (its token-loss sum over the SP group's token
count), so DeepSpeed's average over all ``dp x sp`` ranks (no ``mpu``) is the non-parallel gradient, and
the logged loss is ``sum S / sum N`` over the world: the derivation and why no ``mpu`` are in
docs/sequence-parallelism.md, "Loss and gradients under SP". Preemption (``[checkpoint].save_on_signal``,
preemption.py): a signal only sets a flag, which the step's all-reduce shares, so every rank stops after
the same step, saves through ``_save_checkpoint`` and returns ``TrainResult.preempted_at`` (the launcher
exits 75; docs/training.md, "Preemption").
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from plsh_dist.checkpoint.manager import CheckpointLoadError, CheckpointManager
from plsh_dist.config.resolved import ResolvedRun, resolve_device, resolve_run
from plsh_dist.config.schema import RunConfig
from plsh_dist.distributed import default_backend
from plsh_dist.distributed.comm_stats import comm_stats
from plsh_dist.distributed.cpu_shm import unlink_cpu_allreduce_buffer
from plsh_dist.distributed.ports import free_port
from plsh_dist.distributed.rendezvous import check_rendezvous, rendezvous_from_env
from plsh_dist.faults import maybe_fail
from plsh_dist.models import (AttentionConfig, AttentionRuntime, ModelConfig, apply_activation_checkpointing,
                              apply_sequence_parallel, compile_layers, count_parameters)
from plsh_dist.models.pretrained import initial_model
from plsh_dist.perplexity import perplexity
from plsh_dist.train.curves import CURVES_FILE, write_training_curves
from plsh_dist.train.data_setup import DataPipeline, prepare
from plsh_dist.train.ddp_bf16 import forget_initial_step
from plsh_dist.train.deepspeed_config import deepspeed_config
from plsh_dist.train.loss_head import install_chunked_loss
from plsh_dist.train.losses import forward_sums
from plsh_dist.plan import FlopsPlan, model_flops
from plsh_dist.train.metrics_log import MetricsLogger, memory_mb, peak_flops, startup_summary
from plsh_dist.train.optim import build_optimizer, build_scheduler
from plsh_dist.train.preemption import StopRequest, handle_stop_signals, interrupt_ends_at_once, preempted_line
from plsh_dist.train.refusal import RunRefused, refusing
from plsh_dist.train.run_dir import set_aside_previous_run
from plsh_dist.train.run_lock import RunDirLock, claim_out_dir
from plsh_dist.train.validation import mixture_validation, validation_loss

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
    preempted_at: int | None = None
    """Step after which a SIGTERM / SIGUSR1 stopped the run (its checkpoint is
    written), or None; the launcher then exits with ``EXIT_PREEMPTED``."""
    checkpoint_dir: str | None = None
    """The checkpoint written when the run was preempted."""


def init_distributed(device: torch.device, timeout_s: int = 600, rendezvous_timeout_s: float = 15) -> bool:
    """Join the launcher's process group (env:// from deepspeed/torchrun), or a
    1-process group when started as plain ``python``; no-op when already up.
    True when this call joined it (its caller leaves it: ``_holding_out_dir``).

    ``timeout_s``: how long a collective waits for a missing peer before it
    raises ([parallel].timeout_s), so a dead or hung rank ends the job.
    ``rendezvous_timeout_s``: how long this rank may take to reach
    MASTER_ADDR:MASTER_PORT before ``RendezvousUnreachable`` (exit 1, rendezvous.py)."""
    if dist.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    check_rendezvous(rendezvous_from_env(), rendezvous_timeout_s)  # Python: seconds, and signals reach it
    import deepspeed

    with interrupt_ends_at_once():  # C++ from here: Ctrl-C could not raise KeyboardInterrupt until it returned
        deepspeed.init_distributed(dist_backend=default_backend(device), timeout=timedelta(seconds=timeout_s))
    if device.type == "cpu":
        unlink_cpu_allreduce_buffer()
    return True


def _sp_token_count(n_local: torch.Tensor, sp_group) -> torch.Tensor:
    n = n_local.detach().to(torch.float64).clone()
    if sp_group is not None:
        dist.all_reduce(n, group=sp_group)
    return n


def _grad_norm(engine, zero_stage: int) -> float:
    """Global L2 norm of the (averaged, unclipped) gradient: ZeRO >= 1, after ``engine.step()``,
    the norm its optimizer computed; ZeRO 0, before it, from the averaged ``p.grad`` (DeepSpeed's
    plain path keeps no norm, and its bf16 optimizer's is the previous step's until ``step()``)."""
    if zero_stage == 0:
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
    return float(engine.get_global_grad_norm())


def _comm_bytes() -> float:
    """Halo / all-gather bytes this process has sent and received so far."""
    stats = comm_stats()
    return float(stats["sent_bytes"] + stats["recv_bytes"])


# --- set-up -------------------------------------------------------------------------


@dataclass
class Progress:
    """The part of a :class:`TrainSession` that changes while ``train`` runs (the rest is fixed)."""

    comm_bytes: float = 0.0
    """Halo bytes this process had sent + received when the last step ended."""
    checkpoints_written: int = 0
    """Checkpoints this ``train`` call saved (for the closing outputs line)."""


@dataclass(frozen=True)
class TrainSession:
    """What ``setup`` builds for one ``train`` call: this process's view of the run.

    Fixed once built (frozen); what a step or a checkpoint changes is in ``progress``.
    The objects held (engine, data, runtime, logger) keep their own state."""

    run: ResolvedRun
    """The run config resolved for this world and device (``resolve_run``; the config is never modified)."""
    checkpoints: CheckpointManager
    """Everything the loop does with checkpoints: resume, save, export (checkpoint/manager.py)."""
    sp_group: Any
    """This rank's sequence-parallel process group."""
    model_cfg: ModelConfig
    attn_cfg: AttentionConfig
    data: DataPipeline
    runtime: AttentionRuntime
    """Step / micro-step of the hash seeds; the model's attention reads it."""
    engine: Any
    """The DeepSpeed engine wrapping the model, optimizer and scheduler."""
    n_params: int
    start_step: int
    """Optimizer steps already done (> 0 after a resume)."""
    log: MetricsLogger
    stop: StopRequest = field(default_factory=StopRequest)
    """Set by the SIGTERM / SIGUSR1 handler ``train`` installs; read at the end of each step."""
    progress: Progress = field(default_factory=Progress)
    """The mutable part: halo byte count, checkpoints written."""
    flops: FlopsPlan | None = None
    """Model FLOPs of one optimizer step (the planner's ``model_flops``: PLSH's expected pairs)."""
    peak: tuple[float | None, str] = (None, "")
    """Peak FLOP/s of one device (None: unknown, no MFU) and where it comes from (``peak_flops``)."""

    # What the resolved run holds, by the names the loop reads.
    cfg = property(lambda self: self.run.cfg)
    device = property(lambda self: self.run.device)
    rank = property(lambda self: self.run.rank)
    world = property(lambda self: self.run.world)
    dims = property(lambda self: self.run.dims)
    precision = property(lambda self: self.run.precision)
    out_dir = property(lambda self: self.run.out_dir)
    tokens_per_step = property(lambda self: self.run.tokens_per_step)

    @property
    def resume(self) -> tuple[Path, str] | None:
        """(checkpoint root, tag) resumed from, or None for a fresh run."""
        return self.checkpoints.resume


def setup(cfg: RunConfig, lock: RunDirLock | None = None, stop: StopRequest | None = None) -> TrainSession:
    """Device, process groups, data, model, DeepSpeed engine, resume and logger; collective.

    Every check of the user's input comes first and refuses the run
    (``RunRefused``: config, resume choice, data, checkpoint; exit 2) with
    nothing written to ``out_dir``. Once the run is accepted (``_accept``),
    rank 0 moves a previous run aside if this one does not continue it
    (run_dir.py), writes the resolved config and sets aside the checkpoints
    of an abandoned line; then the logger opens metrics.jsonl and the
    start-up summary is printed.

    ``lock``: rank 0's lock of ``out_dir`` (``train`` takes it, run_lock.py),
    kept when a previous run is moved aside; None elsewhere. ``stop``: the stop request the
    signal handler writes (``train`` installs one); None: a request nothing sets.
    """
    with refusing("config"):
        device = resolve_device(cfg.run.device)
    init_distributed(device, cfg.parallel.timeout_s, cfg.parallel.rendezvous_timeout_s)
    with refusing("config"):  # the layout, and e.g. bf16 master weights with precision "auto" on a CPU
        run = resolve_run(cfg, dist.get_world_size(), device, dist.get_rank())
    rank, dims = run.rank, run.dims
    checkpoints = CheckpointManager(run)
    with refusing("resume"):  # before the data: a refused resume costs no tokenising
        checkpoints.find_resume()
    # DP groups go unused: DeepSpeed reduces gradients over the whole world (module doc).
    sp_group = dims.build_groups(timeout=timedelta(seconds=cfg.parallel.timeout_s))[0]

    prepared = prepare(cfg.data, cfg.tokenizer)  # refuses bad data on every rank alike
    with refusing("config"):
        run.check_tokenizer_vocab(prepared.tokenizer.vocab_size)  # a tokenizer trained or replaced since load_config
    with refusing("resume"):  # the tokenizer the data preparation trained or loaded: the run's own?
        checkpoints.check_tokenizer(prepared.tokenizer.fingerprint)
    model_cfg, attn_cfg = cfg.model, cfg.attention
    with refusing("data"):  # e.g. a corpus too small for one global batch
        data = DataPipeline(prepared, cfg.data, dp_rank=dims.dp_rank(rank), dp_size=dims.dp_size,
                            sp_rank=dims.sp_rank(rank), sp_size=dims.sp_size)

    torch.manual_seed(cfg.run.seed)  # identical init on every rank
    runtime = AttentionRuntime(run_seed=cfg.run.seed)
    engine, n_params = _build_engine(run, runtime, sp_group, load_universal=checkpoints.load_universal)
    start_step = _resume(checkpoints, engine, data)
    _accept(run, checkpoints, start_step, lock)

    log = MetricsLogger(cfg.run.out_dir, enabled=rank == 0, tensorboard=cfg.logging.tensorboard,
                        progress=cfg.logging.progress, total_steps=cfg.run.max_steps, initial_step=start_step)
    # A fresh run starts a fresh metrics.jsonl; a resumed one drops what the
    # interrupted run logged after its checkpoint (those steps are replayed).
    log.truncate_after(start_step)
    session = TrainSession(run=run, checkpoints=checkpoints, sp_group=sp_group, model_cfg=model_cfg,
                           attn_cfg=attn_cfg, data=data, runtime=runtime, engine=engine, n_params=n_params,
                           start_step=start_step, log=log, stop=stop if stop is not None else StopRequest(),
                           flops=model_flops(cfg, world_size=run.world, device=device.type, precision=run.precision),
                           peak=peak_flops(device, run.precision, cfg.logging.peak_tflops))
    log.print(startup_summary(_summary(session)))
    return session


def _build_engine(run: ResolvedRun, runtime: AttentionRuntime, sp_group, load_universal: bool = False
                  ) -> tuple[Any, int]:
    """The model (initialised from torch's global RNG, or from [model].init_from) with sequence parallelism
    applied once, optimizer, scheduler and DeepSpeed engine -> ``(engine, parameter count)``.
    ``load_universal``: the engine will load a universal checkpoint (a resume at another shape)."""
    import deepspeed  # here, not at import: DeepSpeed picks its accelerator (DS_ACCELERATOR) when imported

    cfg, device, model_cfg, attn_cfg = run.cfg, run.device, run.cfg.model, run.cfg.attention
    # Random init, or [model].init_from's weights (continued pretraining).
    model = apply_sequence_parallel(initial_model(cfg, model_cfg, attn_cfg, runtime, device), sp_group)
    n_params = count_parameters(model)
    if cfg.memory.loss_chunk_tokens:
        install_chunked_loss(model, cfg.memory.loss_chunk_tokens)  # before DeepSpeed wraps it (loss_head.py)
    if cfg.memory.activation_checkpointing:  # per layer, in place: parameter names unchanged
        apply_activation_checkpointing(model, cfg.memory.activation_checkpointing_mode)
    if cfg.run.compile != "off":
        compile_layers(model, cfg.run.compile)  # per block, in place, the checkpoint inside the compiled layer
    optimizer = build_optimizer(model, cfg.optim, device.type)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.run.max_steps)
    ds_config = deepspeed_config(cfg.deepspeed, cfg.optim, micro_batch_size=cfg.data.micro_batch_size,
                                 device_type=device.type, precision=run.precision,
                                 master_weights=run.master_weights, load_universal=load_universal)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_config, dist_init_required=False)
    forget_initial_step(engine.optimizer)  # ZeRO 0 + bf16 only (ddp_bf16.py)
    return engine, n_params


def _resume(checkpoints: CheckpointManager, engine, data: DataPipeline) -> int:
    """Load the checkpoint the run resumes from, if any (checkpoint/manager.py), and position the data
    after its step -> ``start_step``. A damaged or unsafe checkpoint refuses the run
    (``RunRefused("checkpoint")``)."""
    try:
        start_step, position = checkpoints.load(engine)
    except CheckpointLoadError as exc:
        raise RunRefused("checkpoint", str(exc), every_rank=exc.every_rank) from exc
    # Continue the global data stream where the checkpoint's run stopped, at any DP size.
    data.skip_to(position)
    return start_step


def _accept(run: ResolvedRun, checkpoints: CheckpointManager, start_step: int, lock: RunDirLock | None) -> None:
    """The run is accepted: rank 0 moves a previous run aside unless this one continues it
    from the out_dir's own checkpoints (run_dir.py), writes its record (the resolved config)
    and moves the checkpoints newer than ``start_step`` (an abandoned line, checkpoint/line.py)
    aside; collective."""
    if run.rank == 0:
        moved = None if checkpoints.continues_out_dir else set_aside_previous_run(run.out_dir, lock)
        if moved is not None:
            print(f"plsh_dist: {run.out_dir} held a previous run and this one starts fresh: moved it, whole and "
                  f"unchanged, to {moved} (nothing deleted)", flush=True)
    checkpoints.accept(start_step)
    dist.barrier()


def _summary(s: TrainSession) -> dict[str, str]:
    cfg, m, a, dims = s.cfg, s.model_cfg, s.attn_cfg, s.dims
    gas = cfg.optim.grad_accum_steps
    ac = cfg.memory.activation_checkpointing_mode if cfg.memory.activation_checkpointing else "off"
    return {
        "run": f"{cfg.run.name} -> {s.out_dir}",
        "model": f"{m.family} L={m.num_layers} H={m.hidden_size} "
                 f"heads={m.num_heads}/{m.num_kv_heads} vocab={m.vocab_size}",
        "parameters": f"{s.n_params:,}",
        "attention": f"bias={a.bias} rope={a.rope} samples={a.num_samples} "
                     f"sigma={a.sigma if a.sigma is not None else 'per-head 1/alibi_slope'}",
        "tokenizer": s.data.prepared.tokenizer_origin(),
        **{f"data {name}": _report_head(report, name) for name, report in s.data.prepared.reports.items()},
        **({"mixture": ", ".join(f"{name} {weight:g} ({p['sequences']:,} sequences read, {p['epochs']:.2f} epochs)"
                                 for (name, weight, _, _), p in zip(s.data.prepared.mixture,
                                                                    s.data.source_progress().values()))}
           if s.data.prepared.mixture else {}),
        "layout": f"{dims.describe()} (SP groups {dims.sp_group_ranks()})",
        "tokens/step": f"{s.tokens_per_step:,} = micro {cfg.data.micro_batch_size} x accum {gas} x dp "
                       f"{dims.dp_size} x seq {cfg.data.seq_len} (each rank {cfg.data.seq_len // dims.sp_size} tokens)",
        "engine": f"DeepSpeed ZeRO-{cfg.deepspeed.zero_stage}, {s.precision}, device {s.device}, "
                  f"act-ckpt {ac}, compile {cfg.run.compile}, loss "
                  + (f"chunked ({cfg.memory.loss_chunk_tokens} tokens)" if cfg.memory.loss_chunk_tokens
                     else "plain (full logits)"),
        "flops/step": f"{s.flops.total / 1e9:,.3f} GFLOP model FLOPs (attention {s.flops.attention / s.flops.total:.1%}: "
                      f"the mask's expected query-key pairs, not T^2); peak {s.peak[1]}",
        "on a signal": ("Ctrl-C, SIGTERM, SIGUSR1: finish the step, checkpoint, exit 75 (a second Ctrl-C "
                        "aborts without saving)" if cfg.checkpoint.save_on_signal else
                        "[checkpoint].save_on_signal = false: Ctrl-C and SIGTERM end the run without saving"),
        "steps": f"{s.start_step} -> {cfg.run.max_steps}"
                 + (f" (resumed from {s.resume[0] / s.resume[1]}, loaded in {s.checkpoints.load_s:.2f} s)"
                    if s.resume else ""),
    }


def _report_head(report, name: str) -> str:
    """A split's corpus report (files read, documents and tokens kept) for the summary; skips by
    cause and count only (the examples are logged when the data is prepared)."""
    head = report.summary(name).split(": ", 1)[1].split("; skipped")[0]
    causes = ", ".join(f"{cause}={n}" for cause, n in report.counts.items())
    return head + (f"; skipped {report.skipped} ({causes})" if report.counts else "")


# --- one optimizer step ---------------------------------------------------------------


@dataclass
class StepStats:
    """One optimizer step, reduced over the world."""

    loss: float
    """Mean token loss of the global batch (``sum S / sum N``)."""
    grad_norm: float
    """Global gradient norm before clipping."""
    lr: float
    """The learning rate this step's update used."""
    halo_bytes: float
    """Bytes the attention's SP exchange sent + received in this step, all ranks."""
    stop_ranks: int = 0
    """Ranks that had received a stop signal (SIGTERM / SIGUSR1) when the step ended;
    the same number on every rank, so all of them stop after the same step."""


def train_step(s: TrainSession, step: int) -> StepStats:
    """Optimizer step ``step`` (0-based): ``grad_accum_steps`` micro-steps of forward,
    backward of ``sp_size * S_r / N`` (module doc) and ``engine.step()``; collective.

    The step's one all-reduce also counts the ranks that hold a stop signal
    (``StepStats.stop_ranks``): agreement on preemption at no extra collective."""
    cfg, engine = s.cfg, s.engine
    gas = cfg.optim.grad_accum_steps
    sp_scale = float(s.dims.sp_size)
    sums = torch.zeros(4, dtype=torch.float64, device=s.device)  # loss sum, tokens, comm bytes, stop flags
    lr = engine.get_lr()[0]  # the rate this step's update uses
    grad_norm = float("nan")
    for micro in range(gas):
        batch = s.data.next_train()
        with s.runtime.at(step, micro):  # this micro-step's masks, in its forward and its backward
            loss_sum, n_local = forward_sums(engine, batch, s.device)
            n_group = _sp_token_count(n_local, s.sp_group)
            engine.backward(loss_sum * (sp_scale / n_group.to(loss_sum.dtype)))
        if micro == gas - 1 and cfg.deepspeed.zero_stage == 0:
            grad_norm = _grad_norm(engine, 0)
        engine.step()
        sums[0] += loss_sum.detach().double()
        sums[1] += n_local.double()
    if cfg.deepspeed.zero_stage > 0:
        grad_norm = _grad_norm(engine, cfg.deepspeed.zero_stage)
    maybe_fail("in_step", step + 1, s.rank)
    comm_now = _comm_bytes()
    sums[2] = comm_now - s.progress.comm_bytes
    s.progress.comm_bytes = comm_now
    sums[3] = 1.0 if s.stop.requested else 0.0  # read once: a later signal counts at the next step
    dist.all_reduce(sums)
    total = sums.tolist()  # one device-to-host copy
    return StepStats(loss=total[0] / total[1], grad_norm=grad_norm, lr=lr, halo_bytes=total[2],
                     stop_ranks=int(total[3]))


# --- validation, logging, checkpoints, export -------------------------------------------


def _validate(s: TrainSession) -> dict[str, float]:
    """``{"val_loss": ...}`` of the first [logging].eval_batches validation batches; a mixture's:
    of each source's, with ``"val_loss/<source>"`` for each; collective."""
    n = s.cfg.logging.eval_batches
    if s.data.prepared.mixture:
        return mixture_validation(s.engine, s.data.val_sets(n), s.runtime, s.device)
    return {"val_loss": validation_loss(s.engine, s.data.val_batches(n), s.runtime, s.device)}


def _log_step(s: TrainSession, done: int, stats: StepStats, tokens_per_s: float) -> None:
    """metrics.jsonl / tensorboard after step ``done`` (every [logging].every_steps,
    the first and the last step), the progress (a bar on a terminal, else one line per
    logged step) and the periodic validation ([logging].eval_every)."""
    cfg = s.cfg
    metrics: dict[str, Any] = {}
    # Achieved model FLOP/s of one device: the step's model FLOPs over its time, per rank.
    flops_per_s = s.flops.total * tokens_per_s / s.tokens_per_step / s.world
    progress = {"loss": f"{stats.loss:.3f}", "lr": f"{stats.lr:.2e}", "tok/s": f"{tokens_per_s:.0f}",
                "TFLOP/s": f"{flops_per_s / 1e12:.3g}"}
    if s.peak[0] is not None:
        progress["mfu"] = f"{flops_per_s / s.peak[0]:.1%}"
    logged = done % cfg.logging.every_steps == 0 or done in (s.start_step + 1, cfg.run.max_steps)
    if logged:
        metrics = {
            "loss": stats.loss,
            "lr": stats.lr,
            "grad_norm": stats.grad_norm,
            "tokens_per_s": tokens_per_s,
            "tflops": flops_per_s / 1e12,
            "halo_bytes": stats.halo_bytes,
            "memory_mb": memory_mb(s.device),
        }
        if s.peak[0] is not None:
            metrics["mfu"] = flops_per_s / s.peak[0]
    if cfg.logging.eval_every and done % cfg.logging.eval_every == 0 and done != cfg.run.max_steps:
        metrics.update(_validate(s))
    if metrics:
        s.log.log(done, metrics)
    s.log.advance(1, progress, line=logged)


def _save_checkpoint(s: TrainSession, step: int, loss: float | None) -> Path:
    """Checkpoint after optimizer step ``step``; collective. Returns the published tag directory.
    Rank 0 says how long the save took (every rank's shards written, hashed and published) and its size."""
    s.progress.checkpoints_written += 1
    t0 = time.time()
    tag_dir = s.checkpoints.save(s.engine, step, loss=loss, consumed_sequences=s.data.global_position,
                                 sources=s.data.source_progress())
    if s.rank == 0:
        size = sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file())
        s.log.print(f"checkpoint: {tag_dir} saved in {time.time() - t0:.2f} s ({size / 2**20:.1f} MiB)")
    return tag_dir


def _stop_ranks(s: TrainSession) -> int:
    """Ranks holding a stop signal now (the same count on every rank); collective.
    Asked after a periodic checkpoint, so a signal during the save stops the run there."""
    flag = torch.tensor([1.0 if s.stop.requested else 0.0], dtype=torch.float64, device=s.device)
    dist.all_reduce(flag)
    return int(flag.item())


def _export(s: TrainSession, evaluation: dict) -> Path:
    """safetensors weights + resolved config + tokenizer + model card in ``out_dir/final``; collective."""
    training = {"steps": s.cfg.run.max_steps, "tokens_seen": s.data.global_position * s.cfg.data.seq_len,
                "evaluation": evaluation}
    return s.checkpoints.export(s.engine, training)


def _finish(s: TrainSession, result: TrainResult) -> None:
    """After the last step: final validation, final checkpoint and the export."""
    cfg = s.cfg
    done = cfg.run.max_steps
    evaluation = {}
    if cfg.logging.eval_batches:
        losses = _validate(s)
        result.val_loss = losses["val_loss"]
        ppl = perplexity(result.val_loss)
        evaluation = {**losses, "val_ppl": ppl}
        s.log.log(done, {**losses, "val_ppl": ppl})
        s.log.print(f"validation: loss {result.val_loss:.4f}  ppl {ppl:.2f}"
                    + "".join(f"; {k.split('/', 1)[1]} {v:.4f}" for k, v in losses.items() if "/" in k))
    _save_checkpoint(s, done, result.losses[-1] if result.losses else None)
    if cfg.checkpoint.export_safetensors:
        result.final_dir = str(_export(s, evaluation))


def _outputs_line(s: TrainSession, result: TrainResult) -> str:
    """The closing line: the out_dir and what this call wrote there, nothing it did not."""
    written = ["metrics.jsonl"] + ([CURVES_FILE] if (Path(s.out_dir) / CURVES_FILE).is_file() else [])
    if s.cfg.logging.tensorboard:
        written.append("tensorboard/")
    if s.progress.checkpoints_written:
        written.append("checkpoints/")
    if result.final_dir:
        written.append("final/")
    return f"outputs: {s.out_dir} ({', '.join(written)})"


def _curves(s: TrainSession) -> None:
    """Rank 0: ``training_curves.png`` from metrics.jsonl (loss, lr, tokens/s vs step; curves.py)."""
    if s.rank == 0:
        write_training_curves(s.out_dir)


# --- the loop --------------------------------------------------------------------------


def train(cfg: RunConfig, *, stop_after: int | None = None) -> TrainResult:
    """Run (or resume) the pretraining described by ``cfg``; collective over all ranks.

    ``cfg`` is not modified. ``stop_after``: leave after that optimizer step as
    a preempted job would, with a checkpoint of that step and no final
    evaluation or export (for time-limited allocations, and to test that
    resuming replays the run). SIGTERM / SIGUSR1 do the same after the step
    they arrive in, when ``[checkpoint].save_on_signal`` (module doc), and set
    ``TrainResult.preempted_at``.
    """
    with handle_stop_signals(cfg.checkpoint.save_on_signal) as stop, _holding_out_dir(cfg) as lock:
        s = setup(cfg, lock, stop)
        return _train_loop(s, stop_after)


@contextmanager
def _holding_out_dir(cfg: RunConfig) -> Iterator[RunDirLock | None]:
    """Join the process group, then hold ``out_dir``'s lock (rank 0; every rank refuses a busy
    out_dir, run_lock.py) until the block ends, however it ends; collective.

    A run that ends normally (done or preempted) leaves the group it joined here, one it found
    already up stays its owner's. Without that the interpreter exits with gloo's threads still
    running, and a rank can die at exit with "terminate called without an active exception"
    (SIGABRT; the deepspeed launcher reports 250) after a finished run. A failing rank
    does not get here: it leaves at once with ``os._exit`` (failure.py)."""
    with refusing("config"):
        device = resolve_device(cfg.run.device)
    joined = init_distributed(device, cfg.parallel.timeout_s, cfg.parallel.rendezvous_timeout_s)
    with claim_out_dir(cfg.run.out_dir, dist.get_rank()) as lock:
        yield lock
    if joined:  # every collective of the run is behind us (claim_out_dir's last one too)
        dist.destroy_process_group()


def _train_loop(s: TrainSession, stop_after: int | None) -> TrainResult:
    cfg = s.cfg
    max_steps = cfg.run.max_steps
    result = TrainResult(first_step=s.start_step, out_dir=str(s.out_dir))
    s.engine.train()
    s.stop.arm()  # from here Ctrl-C saves a checkpoint (preemption.py)
    last_t, s.progress.comm_bytes = time.time(), _comm_bytes()
    for step in range(s.start_step, max_steps):
        stats = train_step(s, step)
        now = time.time()
        tokens_per_s = s.tokens_per_step / max(now - last_t, 1e-9)
        last_t = now
        result.losses.append(stats.loss)
        result.grad_norms.append(stats.grad_norm)
        done = step + 1
        if not math.isfinite(stats.loss):
            raise FloatingPointError(f"loss is {stats.loss} at step {done}; lower [optim].lr or check the data")

        _log_step(s, done, stats, tokens_per_s)
        last = done == max_steps  # a signal in the last step: the run finishes normally
        signalled = stats.stop_ranks if not last else 0
        periodic = cfg.checkpoint.every_steps and done % cfg.checkpoint.every_steps == 0
        stopping = stop_after is not None and done >= stop_after and not last
        tag_dir = None
        if (periodic or stopping or signalled) and not last:
            tag_dir = _save_checkpoint(s, done, stats.loss)
            if not signalled and cfg.checkpoint.save_on_signal:  # a signal during this save stops the run here
                signalled = _stop_ranks(s)
        maybe_fail("after_step", done, s.rank)
        if signalled:
            s.log.print(preempted_line(done, tag_dir, s.stop, signalled, s.world))
            _curves(s)
            s.log.close()
            result.preempted_at, result.checkpoint_dir = done, str(tag_dir)
            return result
        if stopping:
            s.log.print(f"stopped after step {done} (stop_after); resume with --resume auto")
            _curves(s)
            s.log.close()
            return result

    if s.start_step < max_steps or s.resume is None:
        _finish(s, result)
    _curves(s)
    s.log.print(_outputs_line(s, result))
    s.log.close()
    return result
