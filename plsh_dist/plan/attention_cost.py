"""Attention's share of a step: query-key pairs (-> FLOPs) and its transient memory.

Pairs per head of one causal sequence of T tokens (expectations over the
hash, exact for the deterministic masks):

- exact ALiBi / no bias: every key at or before the query, ``T (T + 1) / 2``;
- window ``w``: ``sum_i min(i + 1, w)``; truncated ALiBi: the same with each
  head's ``w_h = ceil(c sigma_h)``;
- PLSH per sample: a key ``d`` positions back shares the query's block with
  probability ``exp(-d / sigma_h)`` (the kernel the hash estimates), so each
  of the ``s`` samples costs ``sum_i sum_{d <= i} exp(-d / sigma_h)`` pairs;
- PLSH one pass: one attention over the keys sharing a block in at least one
  sample, ``sum_i sum_{d <= i} 1 - (1 - exp(-d / sigma_h))^s`` (about
  ``sigma (ln s + 0.58)`` keys per query);
- fixed blocks: blocks of pitch ``2 sigma_h`` from position 0, counted exactly.

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

from plsh_dist.hashing import FixedBlocks, PositionalLSH, bucket
from plsh_dist.models.attention import BINDING_ATTR, AttentionBinding, head_scales, plsh_dist_attention
from plsh_dist.models.runtime import AttentionRuntime
from plsh_dist.ops.alibi import default_chunk_size, truncation_windows
from plsh_dist.ops.backends import choose_strategy
from plsh_dist.ops.plsh_varlen import VarlenPerSample
from plsh_dist.ops.triton_onepass import TritonOnePass
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
    sigma, _ = head_scales(attn_cfg.sigma, num_heads)
    per_head = isinstance(sigma, torch.Tensor)
    sig = tuple(float(x) for x in sigma) if per_head else (float(sigma),) * num_heads
    device = torch.device(device_type)
    try:
        strategy = choose_strategy(attn_cfg.backend, attn_cfg.method, device, dtype, attn_cfg.num_samples)
    except ValueError:  # flash_attn asked for on a machine without it: plan as if it were there, where its
        # rows are torch's CUDA rows with another varlen kernel (the same layout and method)
        strategy = choose_strategy("torch", attn_cfg.method, torch.device("cuda"), torch.bfloat16, attn_cfg.num_samples)
    samples = attn_cfg.num_samples if attn_cfg.bias == "plsh" else 1
    window, head_windows = attn_cfg.window, None
    if attn_cfg.bias == "truncated":
        head_windows = tuple(truncation_windows(attn_cfg.truncation_c(), sig).tolist())
        window = max(head_windows)
    return AttentionSetup(bias=attn_cfg.bias, sigma=sig, per_head_hash=per_head, num_samples=samples,
                          onepass=strategy.onepass and attn_cfg.bias in ("plsh", "fixed_blocks"),
                          varlen=isinstance(strategy, VarlenPerSample), window=window,
                          fused=isinstance(strategy, TritonOnePass) and attn_cfg.bias in ("plsh", "fixed_blocks"),
                          sampler=attn_cfg.sampler,
                          chunk_size=attn_cfg.chunk_size, head_windows=head_windows)


def _kernel_pairs(T: int, sigma: float, samples: int, onepass: bool) -> float:
    """``sum_{i < T} sum_{d <= i} f(d) = sum_{d < T} (T - d) f(d)``, f the per-sample or one-pass weight."""
    if not onepass:  # f = q^d: closed form, times the s samples
        q, one_minus_q = math.exp(-1.0 / sigma), -math.expm1(-1.0 / sigma)
        return samples * (T * one_minus_q - q * -math.expm1(-T / sigma)) / one_minus_q**2
    # f = 1 - (1 - q^d)^s < s e^{-d / sigma}: past 60 sigma the rest is below e^-60 of the sum
    span = min(T, int(60 * sigma) + 1)
    d = torch.arange(span, dtype=torch.float64)
    f = 1.0 - (1.0 - torch.exp(-d / sigma)) ** samples
    return float(((T - d) * f).sum())


def pairs_per_head(setup: AttentionSetup, T: int) -> list[float]:
    """Query-key pairs of each query head for one causal sequence of ``T`` tokens (module doc)."""
    if setup.bias in ("none", "alibi"):
        return [T * (T + 1) / 2] * len(setup.sigma)
    if setup.bias in ("window", "truncated"):
        windows = setup.head_windows if setup.bias == "truncated" else (setup.window,) * len(setup.sigma)
        return [min(w, T) * (min(w, T) + 1) / 2 + (T - min(w, T)) * min(w, T) for w in windows]
    if setup.bias == "fixed_blocks":
        out = []
        for sigma in setup.sigma:
            pitch = 2.0 * sigma
            sizes = torch.bincount(bucket(torch.arange(T, dtype=torch.float64), pitch, 0.0).long()).double()
            out.append(float((sizes * (sizes + 1) / 2).sum()))
        return out
    return [_kernel_pairs(T, sigma, setup.num_samples, setup.onepass) for sigma in setup.sigma]


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
    lsh = FixedBlocks(sigma) if setup.bias == "fixed_blocks" else \
        PositionalLSH(sigma, setup.num_samples, seed=0, sampler=setup.sampler)
    return kernel_tiles(lsh, seq_len, heads, head_dim=head_dim)


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

    - PLSH / fixed blocks on the fused Triton kernel (``triton_onepass.py``): forward
      the call's tables (``kernel_bias.py``): every token's block start per bias head and
      sample (int32; causal) and the per-query-tile spans of its three tile
      shapes (4 int32 a sample, tiles of at least 32 rows), plus the band limits (4 int32 per tile and
      head); they are held for the backward, which adds dq, dk, dv, the fp32 row sums
      ``D`` (``u / D``) and the fp32 copy of dout they come from (``u`` fp32);
    - PLSH / fixed blocks, varlen per sample (``plsh_varlen.py``): forward
      copies q, k, v into the rows layout (k, v repeated to Hq heads with a
      per-head hash), an fp32 merged output, one sample's output, and the
      fp32 merge temporaries (2 fp32 u); backward re-lays q, out, dout, k, v
      (5 b u), fp32 dq/dk/dv accumulators, one sample's dq/dk/dv and the
      kernel's fp32 dq accumulator;
    - no bias (PyTorch flash SDPA): backward dq, dk, dv and the kernel's fp32 dq accumulator;
    - exact / windowed ALiBi (``alibi.py``, query chunks of C against K keys):
      k, v expanded to Hq heads, per chunk the bias (fp32 + its cast) and the
      explicit logits / probabilities (fp32) of every batch row; backward adds
      fp32 dk, dv over the expanded keys and the chunk's gradient products.
    """
    u = batch * tokens * q_heads * head_dim
    kv_per_q = kv_heads / q_heads
    if setup.fused:
        bias_heads = q_heads if setup.per_head_hash else 1
        tables = 4 * bias_heads * setup.num_samples * keys * (1 + 3 * 4 / 32)  # starts, spans at >= 32 rows
        bands = 4 * 4 * batch * q_heads * math.ceil(keys / 32)
        fwd = tables + bands
        bwd = b * u * (1 + 2 * kv_per_q) + 4 * u / head_dim + 4 * u + fwd
        return Workspace(int(fwd), int(bwd), "counted (fused Triton kernel)")
    if setup.bias in ("plsh", "fixed_blocks"):
        rep = 1.0 if setup.per_head_hash else kv_per_q
        rows = b * u * (1 + 2 * rep)
        fwd = rows + 4 * u + b * u + 8 * u
        bwd = b * u * (3 + 2 * rep) + 4 * u * (1 + 2 * rep) + b * u * (1 + 2 * rep) + 4 * u
        how = "counted (varlen per-sample path)"
        if setup.onepass:
            how += "; method onepass on CUDA runs explicit matmuls, not modelled: per-sample count used"
        return Workspace(int(fwd), int(bwd), how)
    if setup.bias == "none":
        return Workspace(0, int(b * u * (1 + 2 * kv_per_q) + 4 * u), "counted (flash SDPA)")
    k_exp = b * batch * keys * q_heads * head_dim  # one of k, v expanded to Hq heads
    chunk = setup.chunk_size or default_chunk_size(q_heads, keys)
    # truncated: the widest head's span bounds every window group's
    span = min(keys, setup.window) + chunk if setup.bias in ("window", "truncated") else keys
    e = q_heads * min(chunk, tokens) * span  # bias elements of one chunk
    per_chunk_fwd = batch * e * (12 + b) + e * (4 + b) + 13 * e // q_heads
    per_chunk_bwd = batch * e * (16 + 2 * b) + e * (4 + b) + 13 * e // q_heads
    fwd = 2 * k_exp + per_chunk_fwd
    bwd = 2 * k_exp + b * u + 2 * (4 // b) * k_exp + per_chunk_bwd
    return Workspace(int(fwd), int(bwd), "counted (chunked exact ALiBi)")


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
