"""Dense fp64 reference attention for the model tests (imported by name; not a test file)."""

import torch

from plsh_dist.biases import bias_for
from plsh_dist.ops.reference import dense_attention

DENSE_REF = "plsh_dist_dense_ref"


def reference_weights(cfg, runtime, layer: int, num_heads: int, positions: torch.Tensor):
    """The weight matrix W (Hq or 1, T, T) that cfg's attention applies: its bias's
    ``reference_weights``, built from the public hash / ALiBi definitions, independently of the ops."""
    return bias_for(cfg).reference_weights(positions, num_heads, runtime.layer_seed(layer, cfg.fixed_masks))


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
