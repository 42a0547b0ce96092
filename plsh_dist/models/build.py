"""Build transformers decoders with our attention, and switch its mode.

    model = build_model(presets["tiny"], AttentionConfig(bias="plsh"), AttentionRuntime(run_seed=1))
    runtime = get_runtime(model)            # the trainer: with runtime.at(step, micro): ...
    set_attention_mode(model, AttentionConfig(bias="alibi"))   # evaluation: same weights

The model is transformers' own ``Qwen3ForCausalLM`` / ``LlamaForCausalLM`` /
``MistralForCausalLM`` (its family's, :mod:`plsh_dist.models.families`) under a
registered subclass that changes nothing but its ``model_type``
(``Qwen3PlshForCausalLM``, ``"qwen3_plsh"``; see :mod:`plsh_dist.models.hf_config`),
so a saved ``config.json`` names the attention it needs and plain transformers
refuses it instead of loading a different model. What we add lives in plain attributes (each attention
module's :class:`~plsh_dist.models.attention.AttentionBinding`, ``plsh_binding``:
its attention settings and bias, seed context and sequence-parallel group; a rope flag on the rotary
module) and in the config's ``plsh_dist``
section (the attention mode and the seed rule, kept current by
``set_attention_mode``), so ``state_dict`` / ``save_pretrained`` / DeepSpeed
see an ordinary HF model.

``model_with_weights`` is the checkpoint loader's saved-weights -> model step (exports,
DeepSpeed tags).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn

from plsh_dist.models.attention import BINDING_ATTR, IMPLEMENTATION, AttentionBinding, PositionsCache, register
from plsh_dist.models.config import AttentionConfig, ModelConfig
from plsh_dist.models.rope import set_rope
from plsh_dist.models.runtime import AttentionRuntime


#: plsh_dist's transformers model types, filled by :mod:`plsh_dist.models.hf_config` when
#: ``plsh_dist.models`` is imported (it imports this module, not the other way round).
_MODEL_TYPES: dict = {}


def register_model_types(model_classes: dict, config_classes: dict, describe) -> None:
    """Called by :mod:`plsh_dist.models.hf_config`: family -> causal-LM class, family -> config
    class (live mappings: a family registered later is in them), and the function that writes
    their ``plsh_dist`` section."""
    _MODEL_TYPES.update(classes=model_classes, config_classes=config_classes, describe=describe)


def _causal_lm_class(family: str):
    if not _MODEL_TYPES:
        raise RuntimeError("plsh_dist's model types are not registered: import plsh_dist.models")
    return _MODEL_TYPES["classes"][family]


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The decoder's attention modules (``layers[i].self_attn``), in layer order."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder `layers`; expected a transformers decoder LM")
    return [layer.self_attn for layer in layers]


def build_model(
    model_cfg: ModelConfig,
    attn_cfg: AttentionConfig,
    runtime: AttentionRuntime | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """A transformers causal LM of ``model_cfg`` whose attention is ours.

    Args:
        model_cfg: architecture.
        attn_cfg: attention mode (switchable later, see ``set_attention_mode``).
        runtime: shared seed/step state; a fresh ``AttentionRuntime()`` if None.
        device: where parameters are created; ``"meta"`` allocates nothing
            (for counting, or for DeepSpeed ZeRO-3 / ``to_empty`` flows).
            Default: torch's current default device.
        dtype: parameter dtype (default float32). RMSNorm and rope still
            compute in float32 inside transformers.
    Weights are drawn from torch's global RNG (seed it first for reproducible inits).
    """
    register()
    cls = _causal_lm_class(model_cfg.family)  # checks that the model types are registered
    hf_cfg = model_cfg.to_hf_config(attn_implementation=IMPLEMENTATION, config_classes=_MODEL_TYPES["config_classes"])
    ctx = torch.device(device) if device is not None else contextlib.nullcontext()
    with ctx:
        model = cls(hf_cfg)
    if dtype is not None:
        model = model.to(dtype=dtype)
    # The HF config keeps use_cache=False (training and perplexity never decode);
    # generate() decodes with a KV cache, which plsh_dist attention supports.
    model.generation_config.use_cache = True
    set_attention_mode(model, attn_cfg, runtime if runtime is not None else AttentionRuntime())
    return model


def model_with_weights(
    model_cfg: ModelConfig,
    attn_cfg: AttentionConfig,
    runtime: AttentionRuntime,
    state: dict[str, torch.Tensor],
    *,
    source,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """``build_model(model_cfg, attn_cfg, runtime)`` holding the weights ``state``, in eval mode.

    The saved-weights -> model step of ``plsh_dist.checkpoint.loading.load_model``
    (exports, DeepSpeed tags, run directories); transformers' ``from_pretrained``
    of the registered classes loads through its own loader and gives the same
    logits (tests/models/test_hf_export.py). ``state`` may lack ``lm_head.weight`` when the LM head is
    tied to the embedding (``save_pretrained`` drops it). ``source`` names the
    weights in errors. Raises ValueError when the weights do not fit ``model_cfg``.
    """
    model = build_model(model_cfg, attn_cfg, runtime, device=device, dtype=dtype)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches: torch raises RuntimeError listing every tensor
        raise ValueError(f"{source}: weights do not fit its config: {exc}") from None
    # save_pretrained drops the LM head when it is tied to the embedding.
    missing = [k for k in missing if not (model_cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{source}: weights do not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    if model_cfg.tie_embeddings:
        model.tie_weights()
    return model.to(dtype=dtype).eval()


def set_attention_mode(
    model: nn.Module, attn_cfg: AttentionConfig, runtime: AttentionRuntime | None = None
) -> nn.Module:
    """Make ``model`` (built here or loaded with transformers) use our attention under ``attn_cfg``.

    Switches the HF attention implementation to ours, binds every attention
    module to ``attn_cfg`` and the seed context ``runtime`` (keeps the model's
    current one if None, else a fresh ``AttentionRuntime()``) and keeps the
    sequence-parallel group it was bound to, turns rope on/off. Weights are untouched. Returns the model.
    """
    if not isinstance(attn_cfg, AttentionConfig):
        raise ValueError(f"attn_cfg must be an AttentionConfig, got {type(attn_cfg).__name__}")
    register()
    modules = attention_modules(model)
    current = getattr(modules[0], BINDING_ATTR, None)
    if runtime is None:
        runtime = current.runtime if current is not None else AttentionRuntime()
    group = current.group if current is not None else None
    if model.config._attn_implementation != IMPLEMENTATION:
        model.set_attn_implementation(IMPLEMENTATION)
    positions = current.positions if current is not None and current.positions is not None else \
        _positions_cache(model)
    for module in modules:
        setattr(module, BINDING_ATTR, AttentionBinding(attn_cfg, runtime, module.layer_idx, group, positions))
    set_rope(model, attn_cfg.rope)
    if _MODEL_TYPES and isinstance(model.config, tuple(_MODEL_TYPES["config_classes"].values())):
        _MODEL_TYPES["describe"](model.config, attn_cfg, runtime.run_seed)  # config.json describes the model as it now runs
    return model


def set_attention_group(model: nn.Module, group) -> nn.Module:
    """Make every attention module of ``model`` attend over the sequence-parallel process ``group``
    (each bias then runs its sequence-parallel form); ``None``: one process. Attention modes
    switched later (``set_attention_mode``) keep it. Returns the model.

    Called once through :func:`plsh_dist.models.parallelize.apply_sequence_parallel`.
    """
    for module in attention_modules(model):
        setattr(module, BINDING_ATTR, dataclasses.replace(_binding(module), group=group))
    return model


def _positions_cache(model: nn.Module) -> PositionsCache:
    """The model's one positions cache (every layer of a forward reads the same positions),
    cleared by a forward pre-hook on the decoder: each forward starts without an entry."""
    cache = PositionsCache()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    decoder.register_forward_pre_hook(cache.clear)
    return cache


def _binding(module: nn.Module) -> AttentionBinding:
    binding = getattr(module, BINDING_ATTR, None)
    if binding is None:
        raise ValueError("model has no plsh_dist attention binding: build it with build_model or call "
                         "set_attention_mode(model, attn_cfg) first")
    return binding


def get_runtime(model: nn.Module) -> AttentionRuntime:
    """The seed context (``AttentionRuntime``) shared by the model's attention modules."""
    return _binding(attention_modules(model)[0]).runtime


def count_parameters(model: nn.Module, *, exclude_embeddings: bool = False) -> int:
    """Number of distinct parameters (tied weights counted once; works on meta).

    ``exclude_embeddings`` drops the input embedding (and the LM head when it
    is tied to it), the convention of "non-embedding parameters".
    """
    total = sum(p.numel() for p in model.parameters())
    if exclude_embeddings:
        total -= model.get_input_embeddings().weight.numel()
    return total
