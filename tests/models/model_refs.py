"""Dense fp64 reference attention for the model tests (imported by name; not a test file)."""

import math

import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes
from plsh_dist.ops.reference import alibi_weights, dense_attention

DENSE_REF = "plsh_dist_dense_ref"


def reference_weights(cfg, runtime, layer: int, num_heads: int, positions: torch.Tensor):
    """The weight matrix W (Hq or 1, T, T) that cfg's attention applies, built
    from the public hash / ALiBi definitions, independently of the ops."""
    if cfg.sigma is None:  # ALiBi's per-head slopes, sigma_h = 1 / m_h
        slopes = alibi_slopes(num_heads)
        sigma = slopes.reciprocal()
    else:  # one constant scale: slope 1 / sigma on every head
        sigma = cfg.sigma
        slopes = torch.full((num_heads,), 1.0 / sigma)
    if cfg.bias == "none":
        return None
    if cfg.bias == "alibi":
        return alibi_weights(slopes, positions)
    if cfg.bias == "window":
        return alibi_weights(slopes, positions, window=cfg.window)
    if cfg.bias == "truncated":  # w_h = ceil(c sigma_h), c = ln s + 0.58 unless given
        c = cfg.truncate_c if cfg.truncate_c is not None else math.log(cfg.num_samples) + 0.58
        sig = sigma.tolist() if isinstance(sigma, torch.Tensor) else [sigma] * num_heads
        return alibi_weights(slopes, positions, window=torch.tensor([math.ceil(c * x) for x in sig]))
    if cfg.bias == "plsh":
        seed = runtime.layer_seed(layer, cfg.fixed_masks)
        return PositionalLSH(sigma, cfg.num_samples, seed, cfg.sampler).averaged_mask(positions)
    if cfg.bias == "fixed_blocks":
        return FixedBlocks(sigma).averaged_mask(positions)
    raise AssertionError(cfg.bias)


def dense_reference_attention(module, query, key, value, attention_mask, scaling=None, position_ids=None, **kwargs):
    """HF attention function computing our mode densely in fp64 (returned in query's dtype)."""
    assert attention_mask is None
    cfg, runtime = module.plsh_binding.cfg, module.plsh_binding.runtime
    T = query.shape[2]
    positions = position_ids[0] if position_ids is not None else torch.arange(T)
    weights = reference_weights(cfg, runtime, module.layer_idx, query.shape[1], positions.cpu())
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    out = dense_attention(q, k, v, weights, causal=True, softmax_scale=scaling)
    return out.to(query.dtype), None


def register_reference() -> None:
    """Make DENSE_REF a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(DENSE_REF, dense_reference_attention)


register_reference()
