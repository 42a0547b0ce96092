"""Halo traffic at scale, by simulation from the real hash, next to ring attention and Ulysses.

What one rank moves per layer and per forward when a causal sequence of
``T`` tokens is split over ``P`` sequence-parallel ranks in equal contiguous
chunks (rank ``r`` holds positions ``[r T/P, (r+1) T/P)``), for one sequence
(micro-batch 1) of an attention of ``Hq`` query heads, ``Hkv`` key/value
heads of dim ``D``, ``b`` bytes per element (:data:`QWEN3_0_6B`: 16 / 8 /
128, bf16, 28 layers).

**PLSH halo (simulated).** A rank needs, per kv head ``h``, the positions
``[lo_h, first)`` before its chunk, ``lo_h`` the earliest start over the
samples and the query heads of ``h`` of the block holding its first
position ``first`` (``plsh_dist.distributed.halo.plsh_needs``). With the
chunks tiling ``[0, T)``, every such position is held by an earlier rank,
so the rank receives exactly

    pairs_r = sum_h (first_r - max(lo_h, 0))        (kv head, position) pairs,
    forward bytes_r = pairs_r * 2 D b                (K and V)

which is ``HaloExchange.build(...).recv_tokens()`` (tested against it and
against ``comm_stats`` of a real SP run). Only the ``P`` block starts per
(sample, hash head) are computed (``PositionalLSH.block_bounds`` of the
chunks' first positions: ``O(P s H)``, no bucket of any other position), so
``T = 4M``, ``P = 256``, ``s = 100`` costs milliseconds, whereas building
every rank's ``HaloExchange`` is ``O(P^3)``. Backward sends the halo's dK/dV
back to their owners: the same bytes. The hash of layer ``l`` is the one
the trainer draws at step 0 (``AttentionRuntime(run_seed).layer_seed(l)``).

**Ring attention (formula).** Each rank's K and V chunk travels around the
ring, ``P - 1`` hops; every rank receives every other chunk:

    forward  = (P - 1) * (T / P) * Hkv * D * b * 2
    backward = 2 * forward   (K, V again, P - 1 hops, and the dK/dV accumulators, P - 1 hops)

the lower bound of a ring (ring-flash-attn's backward sends dK/dV one hop
more, home, and in fp32: more).

**Ulysses (formula).** All-to-alls of q, k, v before attention and of out
after; an all-to-all of a local tensor of ``x`` bytes receives (and sends)
``(P - 1) / P * x`` per rank:

    forward  = (P - 1) / P * (T / P) * D * b * (2 Hq + 2 Hkv')
    backward = forward       (dout in, dq, dk, dv out)

``Hkv' = max(Hkv, P)``: with fewer kv heads than ranks the kv heads are
replicated (as DeepSpeed's ALST does). Ulysses needs ``P`` to divide ``Hq``
(each rank attends whole heads): ``P <= 16`` for Qwen3-0.6B, so P = 64 and
256 are infeasible (``feasible = False``; the formula's value is reported
for scale only).

All three count the bytes a rank *receives* per layer for one sequence, the
forward and the backward separately (backward = 1x forward for PLSH and
Ulysses, 2x for ring). Under activation checkpointing each repeats its
forward traffic once more (not included). The validation all-gather of the
SP ops (a few hundred bytes per call) is not counted.

**Host planning time.** What a rank computes on the host before its PLSH
attention can run, per forward (all layers; backward reuses the plans):

- *halo plan*: per layer the hash (``PositionalLSH``: pitches and shifts),
  every rank's need (``plsh_needs``), this rank's ``HaloExchange.build`` and the
  suffix split (``_split``), exactly the calls ``SPBlockAttention.forward``
  makes (its communication excluded);
- *varlen block plan*: the CUDA per-sample path's ``varlen_calls`` for the
  rank's chunk (one layer timed, times the layers). Timed on the CPU, where
  the ``(s, H, T/P)`` bucket table is computed on the host as well: an upper
  bound of its host part on a GPU, which computes the buckets on the device
  (their share is timed apart, ``varlen_buckets``).

Median of repeats, one thread, in CPU seconds of the process
(``time.process_time``: for one thread, the wall time of an unloaded core,
robust when other jobs share the machine; :func:`planning_time`).
"""

from __future__ import annotations

import statistics
import time
from unittest import mock
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["AttentionShape", "QWEN3_0_6B", "CommBytes", "HaloLayer", "HaloSim", "layer_hash", "halo_pairs",
           "simulate_halo", "ring_bytes", "ulysses_bytes", "PlanningTime", "planning_time"]


@dataclass(frozen=True)
class AttentionShape:
    """Attention shapes of a model: heads, head dim, bytes per element, layers."""

    q_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    layers: int

    @property
    def kv_pair_bytes(self) -> int:
        """K and V of one (kv head, position), one sequence."""
        return 2 * self.head_dim * self.dtype_bytes


#: Qwen3-0.6B in bf16 (``plsh_dist.models.presets``: 16 query / 8 KV heads of dim 128, 28 layers).
QWEN3_0_6B = AttentionShape(q_heads=16, kv_heads=8, head_dim=128, dtype_bytes=2, layers=28)


@dataclass(frozen=True)
class CommBytes:
    """Bytes one rank receives per layer (one sequence)."""

    forward: float
    backward: float
    feasible: bool = True

    @property
    def total(self) -> float:
        return self.forward + self.backward


def ring_bytes(seq_len: int, sp: int, shape: AttentionShape = QWEN3_0_6B) -> CommBytes:
    """Ring attention: ``(P - 1)`` hops of each rank's K and V chunk forward; backward 2x (module doc)."""
    _check_split(seq_len, sp)
    fwd = (sp - 1) * (seq_len // sp) * shape.kv_heads * shape.kv_pair_bytes
    return CommBytes(forward=float(fwd), backward=2.0 * fwd)


def ulysses_bytes(seq_len: int, sp: int, shape: AttentionShape = QWEN3_0_6B) -> CommBytes:
    """Ulysses: all-to-alls of q, k, v and out forward, of dout, dq, dk, dv backward (module doc)."""
    _check_split(seq_len, sp)
    kv = max(shape.kv_heads, sp)
    per_rank = (seq_len // sp) * shape.head_dim * shape.dtype_bytes * (2 * shape.q_heads + 2 * kv)
    fwd = (sp - 1) / sp * per_rank
    return CommBytes(forward=fwd, backward=fwd, feasible=shape.q_heads % sp == 0)


def _check_split(seq_len: int, sp: int) -> None:
    if sp < 1 or seq_len % sp:
        raise ValueError(f"seq_len={seq_len} must be a multiple of sp={sp} >= 1")


def layer_hash(sigma: float | None, num_samples: int, layer: int, shape: AttentionShape = QWEN3_0_6B,
               run_seed: int = 0, sampler: str = "iid"):
    """The ``PositionalLSH`` a model of ``shape`` draws for ``layer`` at step 0.

    ``sigma`` None: per-head sigma ``1 / m_h`` (ALiBi's slopes), else one sigma for every head
    (``plsh_dist.biases.head_scales``, as the model builds it).
    """
    from plsh_dist.hashing import PositionalLSH
    from plsh_dist.biases import head_scales
    from plsh_dist.models.runtime import AttentionRuntime

    sig, _ = head_scales(sigma, shape.q_heads)
    seed = AttentionRuntime(run_seed=run_seed).layer_seed(layer)
    return PositionalLSH(sig, num_samples, seed, sampler)


def halo_pairs(lsh, sp: int, tokens: int, q_heads: int, kv_heads: int, offset: int = 0):
    """Causal halo of every rank when ``sp`` chunks of ``tokens`` tile ``[offset, offset + sp * tokens)``.

    Returns ``(pairs, slots, peers)``, int64 ndarray[P] each: the (kv head,
    position) pairs rank ``r`` receives (``HaloExchange.recv_tokens()``), its
    left halo buffer's positions (``left_pos.numel()``) and the number of
    earlier ranks it receives from (``len(HaloExchange.recv)``).
    """
    firsts = torch.arange(sp, dtype=torch.long) * tokens + offset
    H = lsh.num_heads
    g = q_heads // kv_heads
    lo_hash = torch.stack([lsh.block_bounds(firsts, h, ends=False)[0].min(dim=0).values for h in range(H)])  # (H, P)
    if H == 1:
        lo_kv = lo_hash.expand(kv_heads, sp)
    else:
        lo_kv = lo_hash.view(kv_heads, g, sp).min(dim=1).values
    lo_kv = torch.minimum(torch.clamp(lo_kv, min=offset), firsts[None, :])  # positions before offset exist nowhere
    pairs = (firsts[None, :] - lo_kv).sum(dim=0)
    low = lo_kv.min(dim=0).values
    slots = firsts - low
    peers = torch.where(slots > 0, torch.arange(sp) - torch.div(low - offset, tokens, rounding_mode="floor"), 0)
    return pairs.numpy(), slots.numpy(), peers.numpy()


@dataclass(frozen=True)
class HaloLayer:
    """One layer's forward halo over the ranks (bytes received, one sequence)."""

    layer: int
    bytes_mean: float
    bytes_max: int
    max_peers: int
    """Most ranks any rank receives from."""
    slots_max: int


@dataclass(frozen=True)
class HaloSim:
    """The PLSH halo of every layer for one (T, P, sigma, s)."""

    seq_len: int
    sp: int
    sigma: float | None
    num_samples: int
    layers: list[HaloLayer]
    seconds: float
    """Wall time of the simulation itself."""

    @property
    def forward_mean(self) -> float:
        """Mean over layers and ranks of the forward bytes a rank receives per layer."""
        return float(np.mean([x.bytes_mean for x in self.layers]))

    @property
    def forward_max(self) -> int:
        """Worst rank, worst layer."""
        return max(x.bytes_max for x in self.layers)

    @property
    def per_forward_max(self) -> int:
        """Worst rank's forward bytes summed over the layers (every layer's worst rank)."""
        return sum(x.bytes_max for x in self.layers)


def simulate_halo(seq_len: int, sp: int, sigma: float | None, num_samples: int,
                  shape: AttentionShape = QWEN3_0_6B, run_seed: int = 0, sampler: str = "iid") -> HaloSim:
    """Forward halo bytes of every layer and rank (module doc); backward moves the same bytes back."""
    _check_split(seq_len, sp)
    t0 = time.perf_counter()
    out = []
    for layer in range(shape.layers):
        lsh = layer_hash(sigma, num_samples, layer, shape, run_seed, sampler)
        pairs, slots, peers = halo_pairs(lsh, sp, seq_len // sp, shape.q_heads, shape.kv_heads)
        b = pairs * shape.kv_pair_bytes
        out.append(HaloLayer(layer=layer, bytes_mean=float(b.mean()), bytes_max=int(b.max()),
                             max_peers=int(peers.max()), slots_max=int(slots.max())))
    return HaloSim(seq_len, sp, sigma, num_samples, out, time.perf_counter() - t0)


# ---------------------------------------------------------------------------
# Host planning time
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanningTime:
    """CPU seconds of host planning per forward (all layers) on one rank (one thread)."""

    halo: float
    """Hash + ``plsh_needs`` + ``HaloExchange.build`` + split, every layer (median of repeats)."""
    varlen: float | None
    """``varlen_calls`` of the rank's chunk, one layer's median times the layers (None: not timed)."""
    varlen_buckets: float | None = None
    """The part of ``varlen`` that builds the bucket table and finds the block starts
    (``_block_start_indices``, timed alone): on a GPU it runs on the device. The rest,
    ``varlen - varlen_buckets``, is ``varlen_calls`` timed with those starts given (the host's
    part on a GPU too, the device-to-host copy of the starts excluded)."""
    varlen_extrapolated_from: int | None = None
    """Chunk length the varlen times were measured at, when scaled linearly to the real one."""


def _median(fn, repeats: int) -> float:
    """Median CPU seconds of ``fn()`` (``time.process_time``; one thread: unaffected by other jobs' load)."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def _group_chunks(sp: int, tokens: int, rank: int):
    from plsh_dist.distributed.group_chunks import GroupChunks

    return GroupChunks(None, rank, sp, tuple(range(sp)), tuple(r * tokens for r in range(sp)), tokens)


def planning_time(seq_len: int, sp: int, sigma: float | None, num_samples: int,
                  shape: AttentionShape = QWEN3_0_6B, repeats: int = 3, varlen: bool = True,
                  varlen_max_elements: int = 2**28, run_seed: int = 0) -> PlanningTime:
    """Host planning per forward of the last rank (module doc).

    The varlen plan's ``(s, H, T/P)`` bucket table is built on the host here;
    above ``varlen_max_elements`` entries it is timed at the largest chunk
    under the cap and scaled linearly to the real chunk (its cost is linear in
    the chunk's length), reported in ``varlen_extrapolated_from``.
    """
    from plsh_dist.distributed.halo import HaloExchange, plsh_needs
    from plsh_dist.distributed.sp.plsh_halo import _split
    from plsh_dist.ops.varlen import calls as varlen_layout
    from plsh_dist.ops.varlen.calls import _block_start_indices

    _check_split(seq_len, sp)
    tokens = seq_len // sp
    chunks = _group_chunks(sp, tokens, sp - 1)

    def halo_forward():
        for layer in range(shape.layers):
            lsh = layer_hash(sigma, num_samples, layer, shape, run_seed)
            HaloExchange.build(chunks, plsh_needs(lsh, chunks, shape.q_heads, shape.kv_heads, True))
            _split(lsh, chunks, True)

    halo = _median(halo_forward, repeats)
    if not varlen:
        return PlanningTime(halo=halo, varlen=None)
    lsh = layer_hash(sigma, num_samples, 0, shape, run_seed)
    n = tokens
    while n > 1 and num_samples * lsh.num_heads * n > varlen_max_elements:
        n //= 2
    positions = torch.arange(n, dtype=torch.long) + chunks.first
    cpu = torch.device("cpu")
    starts = _block_start_indices(lsh, positions, cpu)
    buckets = _median(lambda: _block_start_indices(lsh, positions, cpu), repeats)
    with mock.patch.object(varlen_layout, "_block_start_indices", lambda *_: starts):  # the rest of varlen_calls
        host = _median(lambda: varlen_layout.varlen_calls(lsh, positions, 1, cpu), repeats)
    scale = tokens / n * shape.layers
    return PlanningTime(halo=halo, varlen=(buckets + host) * scale, varlen_buckets=buckets * scale,
                        varlen_extrapolated_from=n if n != tokens else None)
