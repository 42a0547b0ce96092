"""Attention's share of a step: query-key pairs (-> FLOPs) and its transient memory.

Pairs per head of one causal sequence of T tokens (expectations over the
hash, exact for the deterministic masks) are each bias's own count
(``pairs_per_head`` of its cost model, :mod:`plsh_dist.biases.cost`).

FLOPs per pair and head: ``4 D`` forward (q.k and p.v), ``10 D`` backward
(flash-attention's recompute of q.k plus four matmuls); activation
checkpointing repeats the forward.

Transient memory (the *workspace*: bytes the op allocates beyond its inputs
and its saved output) is counted from the code path the run takes on CUDA,
and measured by running the op once on CPU (``probe_workspace_cpu``),
where the path depends on the method and the kernels' own buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from plsh_dist.biases import bias_for
from plsh_dist.biases.cost import BiasCost, CallShape
from plsh_dist.models.attention import BINDING_ATTR, AttentionBinding, plsh_dist_attention
from plsh_dist.models.runtime import AttentionRuntime
from plsh_dist.ops.backends import choose_strategy
from plsh_dist.plan.kernel_tiles import kernel_tiles
from plsh_dist.plan.memory_measure import peak_cpu_bytes


def attention_cost(attn_cfg, num_heads: int, device_type: str, dtype: torch.dtype) -> BiasCost:
    """``attn_cfg``'s (``AttentionConfig``) bias cost, resolved the way the attention op will for
    ``device_type``: its :class:`~plsh_dist.biases.cost.AttentionSetup` is ``.setup``."""
    device = torch.device(device_type)
    try:
        strategy = choose_strategy(attn_cfg.backend, attn_cfg.method, device, dtype, attn_cfg.num_samples)
    except ValueError:  # flash_attn asked for on a machine without it: plan as if it were there, where its
        # rows are torch's CUDA rows with another varlen kernel (the same layout and method)
        strategy = choose_strategy("torch", attn_cfg.method, torch.device("cuda"), torch.bfloat16, attn_cfg.num_samples)
    return bias_for(attn_cfg).cost(num_heads, strategy)


def attention_flops(cost: BiasCost, seq_len: int, head_dim: int, checkpointing: bool) -> float:
    """Forward + backward attention FLOPs of one sequence of ``seq_len`` tokens, all heads.

    The fused kernel computes whole tiles: its forward's score area at ``4 D`` per
    entry (q.k and p.v; checkpointing repeats it), its backward's at ``7 D`` per
    entry of each of its two kernels' areas (dK/dV: q.k, dp, dv, dk; dQ: q.k, dp,
    dq; ``14 D`` per score over both).
    """
    if cost.setup.fused:
        tiles = fused_tiles(cost, seq_len, head_dim)
        return head_dim * ((4 + (4 if checkpointing else 0)) * tiles.forward_area + 7 * tiles.backward_area)
    per_pair = (4 + 10 + (4 if checkpointing else 0)) * head_dim
    return per_pair * sum(cost.pairs_per_head(seq_len))


def fused_tiles(cost: BiasCost, seq_len: int, head_dim: int):
    """:class:`~plsh_dist.plan.kernel_tiles.KernelTiles` of the fused kernel for the hash of ``cost``'s
    bias (seed 0; the tiles of other seeds differ by a few percent) on Hopper's tiles."""
    return kernel_tiles(cost.kernel_hash(0), seq_len, len(cost.setup.sigma), head_dim=head_dim)


@dataclass(frozen=True)
class Workspace:
    """Transient bytes of one attention call beyond its inputs and saved output."""

    forward: int
    backward: int
    how: str
    """Where the numbers come from."""


def workspace_cuda(cost: BiasCost, shape: CallShape) -> Workspace:
    """Workspace on CUDA (bf16 kernels) of one call of ``shape``, counted from the buffers of the path
    the run takes (u = B x tokens x Hq x D elements, one q-sized tensor):

    - PLSH / fixed blocks on the fused Triton kernel (``triton/attention.py``): forward
      the call's tables (``kernel_bias.py``): every token's block start per bias head and
      sample (int32; causal) and the per-query-tile spans of its three tile
      shapes (4 int32 a sample, tiles of at least 32 rows), plus the band limits (4 int32 per tile and
      head); they are held for the backward, which adds dq, dk, dv, the fp32 row sums
      ``D`` (``u / D``) and the fp32 copy of dout they come from (``u`` fp32);
    - every other path: the bias's own count (its cost model's ``workspace_cuda``: PLSH's varlen
      per-sample path, flash SDPA, chunked exact ALiBi).
    """
    setup = cost.setup
    if setup.fused:
        u, b, keys = shape.u, shape.itemsize, shape.keys
        bias_heads = shape.q_heads if setup.per_head_hash else 1
        tables = 4 * bias_heads * setup.num_samples * keys * (1 + 3 * 4 / 32)  # starts, spans at >= 32 rows
        bands = 4 * 4 * shape.batch * shape.q_heads * math.ceil(keys / 32)
        fwd = tables + bands
        bwd = b * u * (1 + 2 * shape.kv_heads / shape.q_heads) + 4 * u / shape.head_dim + 4 * u + fwd
        return Workspace(int(fwd), int(bwd), "counted (fused Triton kernel)")
    return Workspace(*cost.workspace_cuda(shape))


def probe_workspace_cpu(attn_cfg, *, batch: int, tokens: int, q_heads: int, kv_heads: int, head_dim: int,
                        max_probe_tokens: int = 4096) -> Workspace:
    """Workspace of the run's attention on CPU (fp32), measured: one forward + backward of the
    real op (``plsh_dist_attention``, the function the model calls) at ``min(tokens,
    max_probe_tokens)`` tokens, scaled linearly to ``batch x tokens``."""
    t = min(tokens, max_probe_tokens)
    bp = batch if t == tokens else 1
    module = SimpleNamespace(**{BINDING_ATTR: AttentionBinding(attn_cfg, AttentionRuntime(run_seed=0), layer=0)})
    g = torch.Generator().manual_seed(0)
    q = torch.randn(bp, q_heads, t, head_dim, generator=g, requires_grad=True)
    k, v = (torch.randn(bp, kv_heads, t, head_dim, generator=g, requires_grad=True) for _ in range(2))
    positions = torch.arange(t)[None]
    scaling = head_dim**-0.5

    def forward():
        return plsh_dist_attention(module, q, k, v, None, scaling=scaling, position_ids=positions)[0]

    forward().sum().backward()  # warm-up: first-call allocations do not count
    out, fwd_peak = peak_cpu_bytes(forward)
    dout = torch.randn_like(out)
    _, bwd_peak = peak_cpu_bytes(lambda: out.backward(dout))
    saved_out = out.numel() * out.element_size() + bp * q_heads * t * 4  # out and its fp32 lse
    scale = batch * tokens / (bp * t)
    how = "measured on CPU" + (f" at {bp} x {t} tokens, scaled linearly" if scale != 1 else "")
    return Workspace(int(max(0, fwd_peak - saved_out) * scale), int(bwd_peak * scale), how)
