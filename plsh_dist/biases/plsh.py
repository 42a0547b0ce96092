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
from plsh_dist.distributed.halo import plsh_needs
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.hashing import PositionalLSH, get_sampler
from plsh_dist.ops.backends import METHODS, backend_names, choose_strategy, chosen_name
from plsh_dist.ops.plsh import block_attention, block_attention_op


class PLSH(Bias):
    """Positional LSH with ``num_samples`` hash samples (error ~ 1/sqrt(s)), fresh masks per step."""

    name = spec = "plsh"
    options = {"s": "num_samples", "num_samples": "num_samples", "sigma": "sigma", "sampler": "sampler",
               "rope": "rope"}
    fields = ("sigma", "rope", "num_samples", "sampler", "fixed_masks", "backend", "method")
    seeded = True
    hashed = True
    summary = "positional-LSH estimate of ALiBi"

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

    def hash_args(self, seeds: LayerSeeds, as_tensor: bool) -> tuple[int, int | torch.Tensor, str, bool]:
        """``(num_samples, seed, sampler, fixed)`` of the layer's hash as the ops take them (``as_tensor``: the
        seed as an int64 scalar tensor, for the compiled op)."""
        return self.cfg.num_samples, seeds.seed_tensor() if as_tensor else seeds.seed(), self.cfg.sampler, False

    def one_process(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        cfg = self.cfg
        sigma = head_scales(cfg.sigma, call.num_heads)[0]
        return block_attention(call.q, call.k, call.v, sigma, self.hash_args(seeds, as_tensor=False), call.positions,
                               True, call.scale, cfg.backend, cfg.method, False, call.cu_seqlens)

    def compiled(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """The custom op, which lays the raw position_ids out itself and reads the seed as a tensor."""
        cfg, q, k, v, H = self.cfg, call.q, call.k, call.v, call.num_heads
        num_samples, seed, sampler, fixed = self.hash_args(seeds, as_tensor=True)
        strategy = chosen_name(cfg.backend, cfg.method, q.device, q.dtype, num_samples)
        return block_attention_op(q, k, v, call.positions, call.cu_seqlens, seed, hash_sigma(cfg.sigma, H, q.device),
                                  num_samples, sampler, fixed, True, call.scale, strategy, True)[0]

    def sequence_parallel(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """This rank's chunk: a halo of keys/values (compiled, the seed as a tensor)."""
        cfg = self.cfg
        seed = seeds.seed_tensor() if call.compiled else seeds.seed()
        return sp_attention.plsh_attention(call.q, call.k, call.v, group=call.group,
                                           sigma=head_scales(cfg.sigma, call.num_heads)[0],
                                           num_samples=cfg.num_samples, seed=seed, backend=cfg.backend,
                                           sampler=cfg.sampler, method=cfg.method, **call.common())

    def layer_hash(self, num_heads: int, seeds: LayerSeeds) -> PositionalLSH:
        """The hash of the layer's current step (the last one kept: do not modify it)."""
        key = (num_heads, seeds.seed() if self.seeded else None)
        if self._decoding_hash is None or self._decoding_hash[0] != key:
            self._decoding_hash = (key, self.new_hash(num_heads, key[1]))
        return self._decoding_hash[1]

    def new_hash(self, num_heads: int, seed: int) -> PositionalLSH:
        """The hash of ``seed`` for ``num_heads`` query heads."""
        return PositionalLSH(head_scales(self.cfg.sigma, num_heads)[0], self.cfg.num_samples, seed, self.cfg.sampler)

    def decode(self, q, k, v, q_pos, k_pos, scale, seeds: LayerSeeds) -> torch.Tensor:
        """The table's decoding strategy (the one-pass form over each query's band) with the full
        forward's hash, whichever method the full forward uses."""
        lsh = self.layer_hash(q.shape[2], seeds)
        strategy = choose_strategy(self.cfg.backend, self.cfg.method, q.device, q.dtype, lsh.num_samples,
                                   decoding=True)
        return strategy.forward(q, k, v, q_pos, k_pos, lsh, scale=scale)

    def reference_weights(self, positions, num_heads: int, seed: int) -> torch.Tensor:
        """The average of the s sampled block masks (its expectation is ALiBi's weights)."""
        sigma = head_scales(self.cfg.sigma, num_heads)[0]
        return PositionalLSH(sigma, self.cfg.num_samples, seed, self.cfg.sampler).averaged_mask(positions)

    # --- cost ---

    def cost_samples(self) -> int:
        return self.cfg.num_samples

    @classmethod
    def pairs_per_head(cls, setup, T: int) -> list[float]:
        """A key ``d`` back shares the query's block in one sample with probability ``exp(-d / sigma_h)``:
        per sample ``sum_i sum_{d <= i} exp(-d / sigma_h)`` pairs, times s; one pass, the keys sharing
        a block in at least one sample, ``1 - (1 - exp(-d / sigma_h))^s`` each."""
        return [_kernel_pairs(T, sigma, setup.num_samples, setup.onepass) for sigma in setup.sigma]

    @classmethod
    def kernel_hash(cls, setup, sigma, seed: int) -> PositionalLSH:
        return PositionalLSH(sigma, setup.num_samples, seed=seed, sampler=setup.sampler)

    @classmethod
    def sp_needs(cls, setup, layout, q_heads, kv_heads, seed):
        """The halo the hash of ``seed`` needs (every layer's differs: the planner draws each)."""
        sigma = torch.tensor(setup.sigma) if setup.per_head_hash else setup.sigma[0]
        return plsh_needs(cls.kernel_hash(setup, sigma, seed), layout, q_heads, kv_heads, causal=True)

    @classmethod
    def workspace_cuda(cls, setup, batch, tokens, keys, q_heads, kv_heads, head_dim, b):
        """The varlen per-sample path (``varlen/strategy.py``): forward copies q, k, v into the rows layout
        (k, v repeated to Hq heads with a per-head hash), an fp32 merged output, one sample's output and
        the fp32 merge temporaries (2 fp32 u); backward re-lays q, out, dout, k, v (5 b u), fp32
        dq/dk/dv accumulators, one sample's dq/dk/dv and the kernel's fp32 dq accumulator."""
        u = batch * tokens * q_heads * head_dim
        rep = 1.0 if setup.per_head_hash else kv_heads / q_heads
        rows = b * u * (1 + 2 * rep)
        fwd = rows + 4 * u + b * u + 8 * u
        bwd = b * u * (3 + 2 * rep) + 4 * u * (1 + 2 * rep) + b * u * (1 + 2 * rep) + 4 * u
        how = "counted (varlen per-sample path)"
        if setup.onepass:
            how += "; method onepass on CUDA runs explicit matmuls, not modelled: per-sample count used"
        return int(fwd), int(bwd), how


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
