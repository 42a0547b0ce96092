"""Positional LSH: the estimate of ALiBi from s random block masks drawn by hashing positions.

Computed by ``plsh_dist::block_attention`` on the strategy PLSH's table chooses
(:mod:`plsh_dist.ops.backends`: per sample or one pass, and on which kernel); under sequence
parallelism a rank receives the keys and values its blocks reach across the chunk boundary.

Legend: B batch, T tokens, Hq query heads, Hkv key/value heads, D head dim, s samples.
"""

from __future__ import annotations

import math

import torch

from plsh_dist.biases.base import AttentionCall, Bias, LayerSeeds, hash_sigma, head_scales
from plsh_dist.biases.cost import BiasCost, CallShape
from plsh_dist.distributed.halo import plsh_needs
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.hashing import PositionalLSH, get_sampler
from plsh_dist.ops.backends import METHODS, backend_names, choose_strategy
from plsh_dist.ops.plsh import block_attention


class PLSHCost(BiasCost):
    """The expected band of the hash (pairs), CUDA's varlen per-sample path (workspace), and the hash of
    each seed (kernel tiles, halo)."""

    def pairs_per_head(self, T: int) -> list[float]:
        """A key ``d`` back shares the query's block in one sample with probability ``exp(-d / sigma_h)``:
        per sample ``sum_i sum_{d <= i} exp(-d / sigma_h)`` pairs, times s; one pass, the keys sharing
        a block in at least one sample, ``1 - (1 - exp(-d / sigma_h))^s`` each."""
        setup = self.setup
        return [_kernel_pairs(T, sigma, setup.num_samples, setup.onepass) for sigma in setup.sigma]

    def kernel_hash(self, seed: int) -> PositionalLSH:
        return self.bias.new_hash(len(self.setup.sigma), seed)

    def sp_needs(self, chunks, shape: CallShape, seed: int):
        """The halo the hash of ``seed`` needs (every layer's differs: the planner draws each)."""
        return plsh_needs(self.kernel_hash(seed), chunks, shape.q_heads, shape.kv_heads, causal=True)

    def workspace_cuda(self, shape: CallShape) -> tuple[int, int, str]:
        """The varlen per-sample path (``varlen/strategy.py``): forward copies q, k, v into the rows layout
        (k, v repeated to Hq heads with a per-head hash), an fp32 merged output, one sample's output and
        the fp32 merge temporaries (2 fp32 u); backward re-lays q, out, dout, k, v (5 b u), fp32
        dq/dk/dv accumulators, one sample's dq/dk/dv and the kernel's fp32 dq accumulator."""
        u, b = shape.u, shape.itemsize
        rep = 1.0 if self.setup.per_head_hash else shape.kv_heads / shape.q_heads
        rows = b * u * (1 + 2 * rep)
        fwd = rows + 4 * u + b * u + 8 * u
        bwd = b * u * (3 + 2 * rep) + 4 * u * (1 + 2 * rep) + b * u * (1 + 2 * rep) + 4 * u
        how = "counted (varlen per-sample path)"
        if self.setup.onepass:
            how += "; method onepass on CUDA runs explicit matmuls, not modelled: per-sample count used"
        return int(fwd), int(bwd), how


class PLSH(Bias):
    """Positional LSH with ``num_samples`` hash samples (error ~ 1/sqrt(s)), fresh masks per step."""

    name = spec = "plsh"
    options = {"s": "num_samples", "num_samples": "num_samples", "sigma": "sigma", "sampler": "sampler",
               "rope": "rope"}
    fields = ("sigma", "rope", "num_samples", "sampler", "fixed_masks", "backend", "method")
    seeded = True
    hashed = True
    summary = "positional-LSH estimate of ALiBi"
    cost_model = PLSHCost

    @classmethod
    def check_fields(cls, cfg) -> None:
        if cfg.num_samples < 1:
            raise ValueError(
                f"attention.num_samples must be an int >= 1 (hash samples averaged; error ~ 1/sqrt(s)), "
                f"got {cfg.num_samples!r}; e.g. num_samples = 8"
            )
        get_sampler(cfg.sampler, "attention.sampler")
        if cfg.backend not in backend_names():
            raise ValueError(f"attention.backend must be one of {backend_names()}, got {cfg.backend!r}")
        if cfg.method not in METHODS:
            raise ValueError(f"attention.method must be one of {METHODS}, got {cfg.method!r}")

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self._decoding_hash: tuple[tuple, object] | None = None
        """``(key, hash)`` of the last decoding step: a generation's steps share one hash (a pure
        function of the key), built once, not once per new token."""

    def label(self) -> str:
        return f" s={self.cfg.num_samples}"

    def call_hash(self, call: AttentionCall, seeds: LayerSeeds) -> PositionalLSH:
        """The layer's hash for ``call``. Compiled, a graph's inputs: the seed as a tensor and, in one
        process, sigma on the device (made once there: a CUDA graph can capture no copy from the host)."""
        device = call.q.device if call.compiled and call.group is None else None
        seed = 0 if not self.seeded else seeds.seed_tensor() if call.compiled else seeds.seed()
        return self.new_hash(call.num_heads, seed, device)

    def one_process(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """The op (compiled too: it lays the raw position_ids out itself when ``call.compiled``)."""
        cfg = self.cfg
        return block_attention(call.q, call.k, call.v, self.call_hash(call, seeds), call.positions, True, call.scale,
                               cfg.backend, cfg.method, False, call.cu_seqlens, from_position_ids=call.compiled)

    def sequence_parallel(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """This rank's chunk: a halo of keys/values."""
        return sp_attention.block_attention(call.q, call.k, call.v, self.call_hash(call, seeds), group=call.group,
                                            backend=self.cfg.backend, method=self.cfg.method, **call.common())

    def layer_hash(self, num_heads: int, seeds: LayerSeeds) -> PositionalLSH:
        """The hash of the layer's current step (the last one kept: do not modify it)."""
        key = (num_heads, seeds.seed() if self.seeded else None)
        if self._decoding_hash is None or self._decoding_hash[0] != key:
            self._decoding_hash = (key, self.new_hash(num_heads, key[1]))
        return self._decoding_hash[1]

    def new_hash(self, num_heads: int, seed: int | torch.Tensor, device: torch.device | None = None) -> PositionalLSH:
        """The hash of ``seed`` for ``num_heads`` query heads, its sigma on ``device`` (None: the host's)."""
        return PositionalLSH(self.sigma_on(num_heads, device), self.cfg.num_samples, seed, self.cfg.sampler)

    def sigma_on(self, num_heads: int, device: torch.device | None):
        """The hash's sigma: :func:`head_scales`' on the host (None), or :func:`hash_sigma`'s on ``device``."""
        sigma = self.cfg.sigma
        return head_scales(sigma, num_heads)[0] if device is None else hash_sigma(sigma, num_heads, device)

    def decode(self, q, k, v, q_pos, k_pos, scale, seeds: LayerSeeds) -> torch.Tensor:
        """The table's decoding strategy (the one-pass form over each query's band) with the full
        forward's hash, whichever method the full forward uses."""
        lsh = self.layer_hash(q.shape[2], seeds)
        strategy = choose_strategy(self.cfg.backend, self.cfg.method, q.device, q.dtype, lsh.num_samples,
                                   decoding=True)
        return strategy.forward(q, k, v, q_pos, k_pos, lsh, scale=scale)

    def reference_weights(self, positions, num_heads: int, seed: int) -> torch.Tensor:
        """The average of the s sampled block masks (its expectation is ALiBi's weights)."""
        return self.new_hash(num_heads, seed).averaged_mask(positions)

    def samples(self) -> int:
        return self.cfg.num_samples


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
