"""Hooking positional-LSH attention into transformers decoders (Qwen3, Llama, Mistral).

Importing this package registers the ``"plsh_dist"`` attention implementation
with transformers. Public API:

- ``ModelConfig``, ``AttentionConfig``: documented, checked dataclasses;
- ``presets``: ``"tiny"`` (CPU tests) and ``"qwen3-0.6b"``;
- ``build_model(model_cfg, attn_cfg, runtime=None, *, device=None, dtype=None)``;
- ``set_attention_mode(model, attn_cfg, runtime=None)``: same weights, other attention;
- ``set_attention_ops(model, ops)``: which ops compute the attention (SP binds its own);
- ``AttentionRuntime`` (run seed, step, micro-step), ``get_runtime(model)``,
  ``hash_seed(run_seed, step, micro_step, layer)``;
- ``count_parameters(model, exclude_embeddings=False)``.
"""

from plsh_dist.models.attention import IMPLEMENTATION
from plsh_dist.models.build import (
    attention_modules,
    build_model,
    count_parameters,
    get_runtime,
    set_attention_mode,
    set_attention_ops,
)
from plsh_dist.models.config import BIASES, FAMILIES, AttentionConfig, ModelConfig, presets
from plsh_dist.models.rope import rope_enabled, set_rope
from plsh_dist.models.runtime import AttentionRuntime, hash_seed

__all__ = [
    "IMPLEMENTATION",
    "AttentionConfig",
    "ModelConfig",
    "BIASES",
    "FAMILIES",
    "presets",
    "build_model",
    "set_attention_mode",
    "set_attention_ops",
    "get_runtime",
    "attention_modules",
    "count_parameters",
    "set_rope",
    "rope_enabled",
    "AttentionRuntime",
    "hash_seed",
]
