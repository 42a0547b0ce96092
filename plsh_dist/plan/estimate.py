"""One rank's memory peak and the step's FLOPs for a run config at a given layout.

``plan_run(cfg, world_size=..., device=...)`` checks the layout exactly as
the trainer does (``RunConfig.validate``: the same messages), then adds:

- states (``zero_states``): weights, gradients, optimizer states and DeepSpeed's buffers;
- activations (``activations``): every layer's saved tensors (or, with
  activation checkpointing, its input; selective: also its matmuls' and
  attention's outputs) for this rank's ``B x seq_len / sp``
  tokens, the model's own, the loss's, and under SP the halo keys/values;
- transients at the moments memory peaks, the largest of which is the estimate
  (forward moments without the gradient buffers DeepSpeed sets up when
  backward starts): the loss's forward and backward (plain: 12 bytes x V per token; chunked: per chunk),
  the start of the last layer's backward (all its activations, rebuilt under
  checkpointing, plus the incoming gradients and the first MLP gradient),
  its attention forward and backward (the attention workspace), and the
  optimizer step.

FLOPs per optimizer step: matmuls (6 x the matmul weights per token; +2 x
the layers' with full checkpointing, +2 x the LM head's with the chunked loss's
recompute) and attention (``attention_cost``), for the whole job and per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from plsh_dist.config.schema import resolve_master_weights, resolve_precision
from plsh_dist.plan.activations import ActivationBytes, activation_bytes, loss_peak_bytes
from plsh_dist.biases.cost import AttentionSetup, BiasCost, CallShape
from plsh_dist.plan.attention_cost import Workspace, attention_cost, attention_flops, probe_workspace_cpu, workspace_cuda
from plsh_dist.plan.halo_traffic import LayerTraffic, sp_traffic
from plsh_dist.plan.shapes import ModelShapes, RankBatch, model_shapes
from plsh_dist.plan.zero_states import StateBytes, state_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on one rank."""

    states: StateBytes
    per_token: ActivationBytes
    activations: int
    """Saved activations of the micro-batch at the end of forward (loss excluded)."""
    loss_peak: int
    """The loss's own peak (its saved part included), for the configured path."""
    loss_peak_plain: int
    loss_peak_chunked: int
    """Both paths, for comparison (chunked at the configured chunk, or 2048 when plain)."""
    attention: Workspace
    halo_buffers: int
    """Halo keys/values one layer keeps for its backward (SP only)."""
    candidates: dict[str, int] = field(default_factory=dict)
    """Memory at each moment that may be the peak."""

    @property
    def peak(self) -> int:
        return max(self.candidates.values())

    @property
    def peak_at(self) -> str:
        return max(self.candidates, key=self.candidates.get)


@dataclass(frozen=True)
class FlopsPlan:
    """FLOPs of one optimizer step (every rank together, and one rank's share)."""

    attention: float
    rest: float
    ranks: int

    @property
    def total(self) -> float:
        return self.attention + self.rest

    @property
    def per_rank(self) -> float:
        return self.total / self.ranks


@dataclass(frozen=True)
class Plan:
    """Everything ``launchers/plan.py`` prints for one config and layout."""

    name: str
    device: str
    precision: str
    world: int
    dp: int
    zero_stage: int
    checkpointing: bool
    checkpointing_mode: str
    loss_chunk_tokens: int
    rank_batch: RankBatch
    shapes: ModelShapes
    attention: AttentionSetup
    memory: MemoryPlan
    flops: FlopsPlan
    traffic: list[LayerTraffic]


def _memory(cfg, shapes: ModelShapes, rb: RankBatch, cost: BiasCost, states: StateBytes, b: int,
            device: str, traffic: list[LayerTraffic]) -> MemoryPlan:
    mem = cfg.memory
    n, L, ckpt, chunk = rb.n, shapes.layers, mem.activation_checkpointing, mem.loss_chunk_tokens
    per = activation_bytes(shapes, b)
    halo = max((t.halo_slots_max for t in traffic), default=0) * rb.batch * shapes.kv_dim * b * 2
    keys = rb.tokens + max((t.halo_slots_max for t in traffic), default=0)
    if device == "cpu":
        ws = probe_workspace_cpu(cfg.attention, batch=rb.batch, tokens=rb.tokens, q_heads=shapes.q_heads,
                                 kv_heads=shapes.kv_heads, head_dim=shapes.head_dim)
    else:
        ws = workspace_cuda(cost, CallShape(rb.batch, rb.tokens, keys, shapes.q_heads, shapes.kv_heads,
                                            shapes.head_dim, b))
    kept = per.selective_layer if mem.activation_checkpointing_mode == "selective" else per.checkpointed_layer
    layer_saved = kept if ckpt else per.layer + halo // n
    acts = n * (L * layer_saved + per.model)

    loss = loss_peak_bytes(n, shapes.vocab, shapes.hidden, b, chunk)
    head_grad = shapes.head_params * b  # the LM head's dW, alive from the loss's backward on
    fwd, bwd = states.at_forward, states.at_backward
    last_grads = b * (shapes.layer_params + (0 if shapes.tied else shapes.head_params))  # grads so far
    # The last layer up to its attention: all of it without checkpointing, rebuilt under checkpointing.
    upto_attention = n * (per.layer - per.layer_after_attention) + (halo if ckpt else 0)
    before_last = acts - n * (per.final_norm + (kept if ckpt else per.layer))
    grad_in = 2 * n * b * shapes.hidden  # gradients of the layer output and of the attention output
    candidates = {
        "loss forward": fwd + acts + loss.forward,
        "loss backward": bwd + acts + loss.backward,
        "last layer, attention forward": fwd + before_last + upto_attention + ws.forward,
        "last layer, backward start": bwd + before_last + n * per.layer + halo + grad_in + head_grad
                                      + n * b * shapes.intermediate,
        "last layer, attention backward": bwd + before_last + upto_attention + grad_in + head_grad + last_grads
                                          + ws.backward,
        "optimizer step": states.at_step,
    }
    def loss_peak(c: int) -> int:
        return max(vars(loss_peak_bytes(n, shapes.vocab, shapes.hidden, b, c)).values())

    return MemoryPlan(states=states, per_token=per, activations=acts, loss_peak=max(loss.forward, loss.backward),
                      loss_peak_plain=loss_peak(0), loss_peak_chunked=loss_peak(chunk or 2048), attention=ws,
                      halo_buffers=halo, candidates=candidates)


def _flops(cfg, shapes: ModelShapes, cost: BiasCost, world: int, dp: int) -> FlopsPlan:
    mem = cfg.memory
    seq = cfg.data.seq_len
    sequences = cfg.data.micro_batch_size * cfg.optim.grad_accum_steps * dp
    per_token = 6 * (shapes.layers * shapes.matmul_params_per_layer + shapes.head_params)
    # selective checkpointing recomputes no matmul and no attention (only the cheap ops, not counted)
    full = mem.activation_checkpointing and mem.activation_checkpointing_mode == "full"
    if full:
        per_token += 2 * shapes.layers * shapes.matmul_params_per_layer
    if mem.loss_chunk_tokens:
        per_token += 2 * shapes.head_params
    attn = shapes.layers * attention_flops(cost, seq, shapes.head_dim, full)
    return FlopsPlan(attention=attn * sequences, rest=float(per_token) * seq * sequences, ranks=world)


def model_flops(cfg, *, world_size: int, device: str = "cuda", precision: str | None = None) -> FlopsPlan:
    """Model FLOPs of one optimizer step of ``cfg`` on ``world_size`` ranks: what MFU counts.

    The work the model needs, not the work the run's kernels issue: ``6 x`` the
    matmul weights per token, and per layer and head ``12 D`` per expected
    query-key pair of the configured mask (``pairs_per_head``: PLSH's band,
    ``E[pairs]`` over the hash, not the dense ``T^2``; forward q.k and p.v, backward
    twice that). Unlike ``plan_run``'s FLOPs it counts no recompute (activation
    checkpointing, the chunked loss's, flash-attention's backward q.k) and no tile
    the fused kernel visits beyond the band. Packed documents are not subtracted
    (document masking attends fewer pairs), so with it this is an upper bound. ``precision``: "bf16"
    or "fp32" as already resolved for ``device`` (the trainer's ``ResolvedRun``); None: resolved here.
    """
    shapes = model_shapes(cfg.model, cfg.attention)
    precision = precision or resolve_precision(cfg.deepspeed, device)
    cost = attention_cost(cfg.attention, shapes.q_heads, device, torch.bfloat16 if precision == "bf16" else torch.float32)
    seq = cfg.data.seq_len
    sequences = cfg.data.micro_batch_size * cfg.optim.grad_accum_steps * (world_size // cfg.parallel.sp_size)
    per_token = 6 * (shapes.layers * shapes.matmul_params_per_layer + shapes.head_params)
    attn = shapes.layers * 12 * shapes.head_dim * sum(cost.pairs_per_head(seq))
    return FlopsPlan(attention=attn * sequences, rest=float(per_token) * seq * sequences, ranks=world_size)


def plan_run(cfg, *, world_size: int, device: str = "cuda") -> Plan:
    """The plan of ``cfg`` (a resolved ``RunConfig``) on ``world_size`` ranks of ``device``.

    Raises the trainer's own ValueErrors for layouts it would refuse (seq_len not
    divisible by sp_size, sp_size not dividing the world, bf16 master weights in an fp32 run, ...).
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    cfg.validate(world_size=world_size)
    precision = resolve_precision(cfg.deepspeed, device)
    b = 2 if precision == "bf16" else 4
    attn_cfg = cfg.attention
    shapes = model_shapes(cfg.model, attn_cfg)
    sp = cfg.parallel.sp_size
    dp = world_size // sp
    rb = RankBatch(batch=cfg.data.micro_batch_size, tokens=cfg.data.seq_len // sp, seq_len=cfg.data.seq_len,
                   sp_size=sp)
    cost = attention_cost(attn_cfg, shapes.q_heads, device, torch.bfloat16 if b == 2 else torch.float32)
    ds = cfg.deepspeed
    states = state_bytes(params=shapes.params, largest_module=shapes.largest_module_params, stage=ds.zero_stage,
                         precision=precision, world=world_size, offload_optimizer=ds.offload_optimizer,
                         master_weights=resolve_master_weights(ds, device))
    traffic = sp_traffic(cost, attn_cfg, run_seed=cfg.run.seed, layers=shapes.layers, sp=sp, tokens=rb.tokens,
                         batch=rb.batch, q_heads=shapes.q_heads, kv_heads=shapes.kv_heads,
                         head_dim=shapes.head_dim, b=b)
    memory = _memory(cfg, shapes, rb, cost, states, b, device, traffic)
    return Plan(name=cfg.run.name, device=device, precision=precision, world=world_size, dp=dp,
                zero_stage=ds.zero_stage, checkpointing=cfg.memory.activation_checkpointing,
                checkpointing_mode=cfg.memory.activation_checkpointing_mode,
                loss_chunk_tokens=cfg.memory.loss_chunk_tokens, rank_batch=rb, shapes=shapes,
                attention=cost.setup, memory=memory, flops=_flops(cfg, shapes, cost, world_size, dp), traffic=traffic)
