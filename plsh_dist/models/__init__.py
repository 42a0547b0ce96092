"""Hooking positional-LSH attention into transformers decoders (Qwen3, Llama, Mistral, ...: the family table).

Importing this package registers the ``"plsh_dist"`` attention implementation
with transformers, and plsh_dist's model types (:mod:`plsh_dist.models.hf_config`). Public API:

- ``ModelConfig``, ``AttentionConfig``: documented, checked dataclasses;
- ``FAMILIES``, ``Family``, ``register_family``: the table of model families
  (:mod:`plsh_dist.models.families`; a new transformers decoder is one entry);
- ``presets``: ``"tiny"`` (CPU tests) and ``"qwen3-0.6b"``;
- ``build_model(model_cfg, attn_cfg, runtime=None, *, device=None, dtype=None)``;
- ``model_with_weights(model_cfg, attn_cfg, runtime, state, *, source)``: the one
  saved-weights -> model step;
- ``hf_config``: plsh_dist's transformers model types (``qwen3_plsh`` ...), registered
  on import with ``AutoConfig`` / ``AutoModelForCausalLM`` / ``AutoTokenizer``, so
  ``AutoModelForCausalLM.from_pretrained(export_dir)`` rebuilds the trained attention;
- ``set_attention_mode(model, attn_cfg, runtime=None)``: same weights, other attention;
- ``apply_activation_checkpointing(model, mode)``: per-layer activation checkpointing ("full" or
  "selective"), in place (parameter names unchanged), composing with ``compile_layers``;
- ``apply_sequence_parallel(model, group)``: every attention module attends over the
  sequence-parallel ``group``, once (the model side applies parallelism);
- ``AttentionRuntime`` (run seed, step, micro-step), ``get_runtime(model)``,
  ``hash_seed(run_seed, step, micro_step, layer)``;
- ``count_parameters(model, exclude_embeddings=False)``;
- ``window_cache(model)``: a KV cache keeping only the keys a ``"window"`` /
  ``"truncated"`` mode reads.
"""

from plsh_dist.models.activation_checkpoint import AC_MODES, apply_activation_checkpointing
from plsh_dist.models.attention import IMPLEMENTATION
from plsh_dist.models.build import (
    attention_modules,
    build_model,
    count_parameters,
    get_runtime,
    model_with_weights,
    set_attention_mode,
)
from plsh_dist.models.config import BIASES, FAMILIES, AttentionConfig, ModelConfig, presets
from plsh_dist.models.families import Family, register_family
from plsh_dist.models.parallelize import apply_sequence_parallel, compile_layers
from plsh_dist.models.rope import rope_enabled, set_rope
from plsh_dist.models.runtime import AttentionRuntime, hash_seed
from plsh_dist.models.window_cache import window_cache
from plsh_dist.models import hf_config  # noqa: E402  registers every family's <name>_plsh type

__all__ = [
    "IMPLEMENTATION",
    "AttentionConfig",
    "ModelConfig",
    "BIASES",
    "FAMILIES",
    "Family",
    "register_family",
    "presets",
    "build_model",
    "model_with_weights",
    "hf_config",
    "set_attention_mode",
    "apply_sequence_parallel",
    "apply_activation_checkpointing",
    "AC_MODES",
    "compile_layers",
    "get_runtime",
    "attention_modules",
    "count_parameters",
    "set_rope",
    "rope_enabled",
    "AttentionRuntime",
    "hash_seed",
    "window_cache",
]
