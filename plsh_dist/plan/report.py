"""Text of a plan: the detailed report, the one-line verdict, and a markdown table row."""

from __future__ import annotations

from plsh_dist.plan.advice import HEADROOM, Advice
from plsh_dist.plan.estimate import Plan


def gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def _flops(x: float) -> str:
    return f"{x / 1e12:.1f} TFLOP" if x >= 1e11 else f"{x / 1e9:.2f} GFLOP"


def _loss_name(chunk: int) -> str:
    return f"chunked ({chunk} tokens)" if chunk else "plain (full logits)"


def fit_line(plan: Plan, device_bytes: int, advice: Advice) -> str:
    """``fits`` / ``does not fit`` with the margin, and the changes that make it fit."""
    peak, budget = plan.memory.peak, HEADROOM * device_bytes
    where = f"{gib(device_bytes)} {'GPU' if plan.device == 'cuda' else 'CPU memory (its share of the machine)'}"
    if peak <= budget:
        return f"FITS: peak {gib(peak)} per rank of {where} ({peak / device_bytes:.0%}; limit {HEADROOM:.0%})"
    head = f"DOES NOT FIT: peak {gib(peak)} per rank > {HEADROOM:.0%} of {where}"
    if not advice.changes:
        return head + "; no config change lowers it: use more GPUs (a larger sp_size) or a shorter seq_len"
    verdict = "fits" if advice.fits else "still does not fit"
    tail = "" if advice.fits else "; beyond that: more GPUs (a larger sp_size) or a shorter seq_len"
    return (f"{head}; with {' '.join(advice.changes)} the peak is {gib(advice.plan.memory.peak)}: {verdict}{tail}")


def _path_name(attention) -> str:
    """The computation the plan counts: the fused kernel, the varlen kernels, or padded blocks."""
    return "fused Triton kernel" if attention.fused else "varlen" if attention.varlen else "padded"


def _kept(plan: Plan) -> int:
    """Bytes per token a checkpointed layer keeps."""
    per = plan.memory.per_token
    return per.selective_layer if plan.checkpointing_mode == "selective" else per.checkpointed_layer


def format_plan(plan: Plan, device_bytes: int, advice: Advice, *, per_layer: bool = False) -> str:
    """The detailed report ``launchers/plan.py`` prints for one config and length."""
    m, st, rb, sh = plan.memory, plan.memory.states, plan.rank_batch, plan.shapes
    lines = [
        f"plan: {plan.name}  seq_len {rb.seq_len:,}  sp {rb.sp_size}  world {plan.world} (dp {plan.dp})  "
        f"{plan.device} {plan.precision}",
        f"  model: {sh.family} L={sh.layers} H={sh.hidden} heads {sh.q_heads}/{sh.kv_heads} D={sh.head_dim} "
        f"I={sh.intermediate} V={sh.vocab} tied={sh.tied}: {sh.params:,} parameters",
        f"  rank micro-batch: {rb.batch} x {rb.tokens:,} tokens; ZeRO {plan.zero_stage} ({st.wrapper}), "
        f"activation checkpointing {plan.checkpointing_mode if plan.checkpointing else 'off'}, "
        f"loss {_loss_name(plan.loss_chunk_tokens)}",
        f"  attention: {plan.attention.bias}, s={plan.attention.num_samples}, "
        f"{'one pass' if plan.attention.onepass else 'per sample'}, {_path_name(plan.attention)} path",
        "memory per rank:",
        f"  weights {gib(st.weights)}  gradients {gib(st.grads + st.grad_buffers)}  fp32 master {gib(st.master)}  "
        f"AdamW states {gib(st.optimizer)}  DeepSpeed buckets {gib(st.buckets)}  step temporaries {gib(st.step_temp)}"
        + (f"  (CPU: {gib(st.cpu)})" if st.cpu else ""),
        f"  activations {gib(m.activations)} ("
        + (f"{_kept(plan)} B/token/layer checkpointed ({plan.checkpointing_mode}), a full layer "
           f"{m.per_token.layer} B/token rebuilt in its backward)" if plan.checkpointing
           else f"{m.per_token.layer} B/token/layer)"),
        f"  loss peak {gib(m.loss_peak)} (plain {gib(m.loss_peak_plain)}, chunked {gib(m.loss_peak_chunked)})",
        f"  attention workspace fwd {gib(m.attention.forward)} / bwd {gib(m.attention.backward)} ({m.attention.how})"
        + (f"; halo K/V kept {gib(m.halo_buffers)}" if m.halo_buffers else ""),
        "  moments: " + "; ".join(f"{k} {gib(v)}" for k, v in m.candidates.items()),
        f"  PEAK {gib(m.peak)} at {m.peak_at}",
        f"FLOPs per optimizer step: attention {_flops(plan.flops.attention)}, the rest {_flops(plan.flops.rest)} "
        f"(attention {plan.flops.attention / plan.flops.total:.1%}); per rank {_flops(plan.flops.per_rank)}",
    ]
    if plan.traffic:
        fwd = [t.forward_bytes_max for t in plan.traffic]
        lines.append(
            f"SP traffic per layer (worst rank, forward K/V; backward returns as much): "
            f"min {fwd and min(fwd) / 2**20:.2f} / mean {sum(fwd) / len(fwd) / 2**20:.2f} / "
            f"max {max(fwd) / 2**20:.2f} MiB; all layers, fwd + bwd: {2 * sum(fwd) / 2**20:.1f} MiB per micro-step"
            + (" (+ the forward again under full activation checkpointing)"
               if plan.checkpointing and plan.checkpointing_mode == "full" else ""))
        if per_layer:
            lines += [f"  layer {t.layer:>3}: worst rank receives {t.recv_tokens_max:,} (head, position) pairs = "
                      f"{t.forward_bytes_max / 2**20:.3f} MiB (mean {t.forward_bytes_mean / 2**20:.3f})"
                      for t in plan.traffic]
    lines.append(fit_line(plan, device_bytes, advice))
    return "\n".join(lines)


def table_header() -> list[str]:
    return ["| config | seq_len | sp x dp | ZeRO, ckpt, loss | states | activations | loss | attn ws (bwd) | "
            "peak / rank | attention / rest FLOPs per step | halo per layer (max) | verdict on the GPU |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]


def table_row(plan: Plan, device_bytes: int, advice: Advice, config: str) -> str:
    m, rb = plan.memory, plan.rank_batch
    halo = f"{max(t.forward_bytes_max for t in plan.traffic) / 2**20:.2f} MiB" if plan.traffic else "-"
    loss = "chunked" if plan.loss_chunk_tokens else "plain"
    changes = " ".join(c.removeprefix("--") for c in advice.changes)
    if m.peak <= HEADROOM * device_bytes:
        verdict = "fits"
    elif advice.fits:
        verdict = f"no; fits with {changes} ({gib(advice.plan.memory.peak)})"
    else:
        verdict = "no" + (f"; {changes} -> {gib(advice.plan.memory.peak)}, still not" if advice.changes else "")
    return (f"| {config} | {rb.seq_len:,} | {rb.sp_size} x {plan.dp} | {plan.zero_stage}, "
            f"{'yes' if plan.checkpointing else 'no'}, {loss} | {gib(m.states.total)} | {gib(m.activations)} | "
            f"{gib(m.loss_peak)} | {gib(m.attention.backward)} | **{gib(m.peak)}** | "
            f"{_flops(plan.flops.attention)} / {_flops(plan.flops.rest)} | {halo} | {verdict} |")
