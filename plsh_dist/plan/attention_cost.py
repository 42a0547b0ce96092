"""Attention's share of a step: query-key pairs (-> FLOPs) and its transient memory.

Pairs per head of one causal sequence of T tokens (expectations over the
hash, exact for the deterministic masks) are each bias's own count
(``pairs_per_head`` of its class in :mod:`plsh_dist.biases`).

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

from plsh_dist.biases import bias_class, bias_for
from plsh_dist.biases.base import sigma_per_head
from plsh_dist.models.attention import BINDING_ATTR, AttentionBinding, plsh_dist_attention
from plsh_dist.models.runtime import AttentionRuntime
from plsh_dist.ops.backends import choose_strategy
from plsh_dist.plan.kernel_tiles import kernel_tiles
from plsh_dist.plan.memory_measure import peak_cpu_bytes


@dataclass(frozen=True)
class AttentionSetup:
    """What the run's attention computes, resolved for the device."""

    bias: str
    sigma: tuple[float, ...]
    """Per query head (a constant sigma repeated)."""
    per_head_hash: bool
    """One hash per head (sigma unset) or one shared by all heads."""
    num_samples: int
    onepass: bool
    varlen: bool
    """CUDA's varlen kernels (one varlen call per sample over all heads)."""
    window: int
    """Key window of ``"window"``; of ``"truncated"``, the widest head's."""
    chunk_size: int | None
    head_windows: tuple[int, ...] | None = None
    """Per query head, ``"truncated"`` only: ``w_h = ceil(c sigma_h)``."""
    fused: bool = False
    """PLSH / fixed blocks on the fused Triton kernel (CUDA with Triton): its cost is the
    tiles it visits (:mod:`plsh_dist.plan.kernel_tiles`), not the pairs of the band."""
    sampler: str = "iid"


def attention_setup(attn_cfg, num_heads: int, device_type: str, dtype: torch.dtype) -> AttentionSetup:
    """Resolve ``attn_cfg`` (``AttentionConfig``) the way the attention op will for ``device_type``."""
    bias = bias_for(attn_cfg)
    sig = sigma_per_head(attn_cfg.sigma, num_heads)
    device = torch.device(device_type)
    try:
        strategy = choose_strategy(attn_cfg.backend, attn_cfg.method, device, dtype, attn_cfg.num_samples)
    except ValueError:  # flash_attn asked for on a machine without it: plan as if it were there, where its
        # rows are torch's CUDA rows with another varlen kernel (the same layout and method)
        strategy = choose_strategy("torch", attn_cfg.method, torch.device("cuda"), torch.bfloat16, attn_cfg.num_samples)
    head_windows = bias.head_windows(sig)
    return AttentionSetup(bias=attn_cfg.bias, sigma=sig, per_head_hash=attn_cfg.sigma is None,
                          num_samples=bias.cost_samples(), onepass=strategy.onepass and bias.hashed,
                          varlen=strategy.cost_model == "varlen",
                          window=max(head_windows) if head_windows else attn_cfg.window,
                          fused=strategy.cost_model == "fused" and bias.hashed, sampler=attn_cfg.sampler,
                          chunk_size=attn_cfg.chunk_size, head_windows=head_windows)


def pairs_per_head(setup: AttentionSetup, T: int) -> list[float]:
    """Query-key pairs of each query head for one causal sequence of ``T`` tokens (module doc; each
    bias's ``pairs_per_head``)."""
    return bias_class(setup.bias).pairs_per_head(setup, T)


def attention_flops(setup: AttentionSetup, seq_len: int, head_dim: int, checkpointing: bool) -> float:
    """Forward + backward attention FLOPs of one sequence of ``seq_len`` tokens, all heads.

    The fused kernel computes whole tiles: its forward's score area at ``4 D`` per
    entry (q.k and p.v; checkpointing repeats it), its backward's at ``7 D`` per
    entry of each of its two kernels' areas (dK/dV: q.k, dp, dv, dk; dQ: q.k, dp,
    dq; ``14 D`` per score over both).
    """
    if setup.fused:
        tiles = fused_tiles(setup, seq_len, head_dim)
        return head_dim * ((4 + (4 if checkpointing else 0)) * tiles.forward_area + 7 * tiles.backward_area)
    per_pair = (4 + 10 + (4 if checkpointing else 0)) * head_dim
    return per_pair * sum(pairs_per_head(setup, seq_len))


def fused_tiles(setup: AttentionSetup, seq_len: int, head_dim: int):
    """:class:`~plsh_dist.plan.kernel_tiles.KernelTiles` of the fused kernel for ``setup``'s hash
    (seed 0; the tiles of other seeds differ by a few percent) on Hopper's tiles."""
    heads = len(setup.sigma)
    sigma = torch.tensor(setup.sigma, dtype=torch.float64) if setup.per_head_hash else setup.sigma[0]
    return kernel_tiles(bias_class(setup.bias).kernel_hash(setup, sigma, 0), seq_len, heads, head_dim=head_dim)


@dataclass(frozen=True)
class Workspace:
    """Transient bytes of one attention call beyond its inputs and saved output."""

    forward: int
    backward: int
    how: str
    """Where the numbers come from."""


def workspace_cuda(setup: AttentionSetup, batch: int, tokens: int, keys: int, q_heads: int, kv_heads: int,
                   head_dim: int, b: int) -> Workspace:
    """Workspace on CUDA (bf16 kernels), counted from the buffers of the path the run takes.

    ``tokens``: this rank's queries; ``keys``: the keys its attention reads
    (tokens, plus the halo / the gathered sequence under SP).
    u = B x tokens x Hq x D elements (one q-sized tensor):

    - PLSH / fixed blocks on the fused Triton kernel (``triton/attention.py``): forward
      the call's tables (``kernel_bias.py``): every token's block start per bias head and
      sample (int32; causal) and the per-query-tile spans of its three tile
      shapes (4 int32 a sample, tiles of at least 32 rows), plus the band limits (4 int32 per tile and
      head); they are held for the backward, which adds dq, dk, dv, the fp32 row sums
      ``D`` (``u / D``) and the fp32 copy of dout they come from (``u`` fp32);
    - every other path: the bias's own count (``workspace_cuda`` of its class in
      :mod:`plsh_dist.biases`: PLSH's varlen per-sample path, flash SDPA, chunked exact ALiBi).
    """
    if setup.fused:
        u = batch * tokens * q_heads * head_dim
        bias_heads = q_heads if setup.per_head_hash else 1
        tables = 4 * bias_heads * setup.num_samples * keys * (1 + 3 * 4 / 32)  # starts, spans at >= 32 rows
        bands = 4 * 4 * batch * q_heads * math.ceil(keys / 32)
        fwd = tables + bands
        bwd = b * u * (1 + 2 * kv_heads / q_heads) + 4 * u / head_dim + 4 * u + fwd
        return Workspace(int(fwd), int(bwd), "counted (fused Triton kernel)")
    return Workspace(*bias_class(setup.bias).workspace_cuda(setup, batch, tokens, keys, q_heads, kv_heads, head_dim,
                                                             b))


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
