"""Configs: checks name the field, dicts round-trip, presets build on meta with the right size."""

import dataclasses

import pytest
import torch

from plsh_dist.biases import bias_for
from plsh_dist.models import (
    FAMILIES,
    AttentionConfig,
    ModelConfig,
    build_model,
    count_parameters,
    presets,
)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(bias="rope"), "attention.bias"),
        (dict(num_samples=0), "attention.num_samples"),
        (dict(sigma=-1.0), "attention.sigma"),
        (dict(window=0), "attention.window"),
        (dict(sampler="sobol"), "attention.sampler"),
        (dict(method="fast"), "attention.method"),
        (dict(backend="cuda"), "attention.backend"),
        (dict(chunk_size=0), "attention.chunk_size"),
        (dict(truncate_c=0.0), "attention.truncate_c"),
        (dict(truncate_c=float("inf")), r"\[attention\]\.truncate_c must be a finite float"),
        (dict(sigma=float("inf")), r"\[attention\]\.sigma must be a finite float"),
        (dict(sigma=float("nan")), r"\[attention\]\.sigma must be a finite float"),
        (dict(truncate_c="wide"), r"\[attention\]\.truncate_c"),
        (dict(rope="yes"), r"\[attention\]\.rope"),  # the generic type check's wording
        (dict(num_samples=True), r"\[attention\]\.num_samples must be an int, got True"),
        (dict(window=2.0), r"\[attention\]\.window must be an int, got 2.0 \(float\); e.g. window = 512"),
        (dict(fixed_masks=1), r"\[attention\]\.fixed_masks must be a bool"),
        (dict(chunk_size="big"), r"\[attention\]\.chunk_size must be an int \(or left out\).*e.g. chunk_size = 1024"),
    ],
)
def test_attention_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AttentionConfig(**kwargs)


def test_truncated_c_defaults_to_plsh_cost():
    """``truncate_c`` unset: ln(num_samples) + 0.58, the one-pass band of num_samples samples."""
    import math

    assert bias_for(AttentionConfig(bias="truncated")).c == pytest.approx(math.log(8) + 0.58)
    assert bias_for(AttentionConfig(bias="truncated", num_samples=20)).c == pytest.approx(math.log(20) + 0.58)
    assert bias_for(AttentionConfig(bias="truncated", truncate_c=3)).c == 3.0
    cfg = AttentionConfig(bias="truncated", truncate_c=2.5)
    assert AttentionConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(family="gpt2"), "model.family"),
        (dict(num_heads=6, num_kv_heads=4), "model.num_heads"),
        (dict(head_dim=33), "model.head_dim"),
        (dict(vocab_size=0), "model.vocab_size"),
        (dict(init_std=0.0), "model.init_std"),
        (dict(vocab_size=0), r"e.g. vocab_size = 151936"),  # value errors name a fix too
        (dict(rope_theta=-1.0), r"model.rope_theta must be a number > 0.*e.g. rope_theta = 1000000.0"),
        (dict(num_layers=True), r"\[model\]\.num_layers must be an int, got True"),
        (dict(hidden_size=1024.0), r"\[model\]\.hidden_size must be an int"),
        (dict(tie_embeddings=1), r"\[model\]\.tie_embeddings must be a bool"),
        (dict(init_std="small"), r"\[model\]\.init_std must be a finite float.*e.g. init_std = 0.02"),
    ],
)
def test_model_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


def test_dicts_round_trip_and_presets_resolve():
    attn = AttentionConfig(bias="window", sigma=256, window=64)
    assert attn.sigma == 256.0 and isinstance(attn.sigma, float)
    assert AttentionConfig.from_dict(attn.to_dict()) == attn
    model = presets["tiny"]
    assert ModelConfig.from_dict(model.to_dict()) == model
    assert ModelConfig.from_dict({"preset": "qwen3-0.6b", "vocab_size": 32000}) == dataclasses.replace(
        presets["qwen3-0.6b"], vocab_size=32000
    )
    with pytest.raises(ValueError, match="unknown keys"):
        AttentionConfig.from_dict({"bias": "plsh", "samples": 4})
    with pytest.raises(ValueError, match="preset"):
        ModelConfig.from_dict({"preset": "qwen3-7b"})


def test_qwen3_06b_on_meta_has_published_size():
    model = build_model(presets["qwen3-0.6b"], AttentionConfig(), device="meta")
    assert next(model.parameters()).device.type == "meta"
    # Published: 0.6B parameters, 0.44B non-embedding (Qwen3-0.6B model card).
    # Exact count of the architecture with tied embeddings at vocab 151936:
    # embedding 151936*1024 + 28 layers * 15,730,944 + final norm 1024.
    assert count_parameters(model) == 596_049_920
    assert count_parameters(model, exclude_embeddings=True) == 440_467_456
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (1024, 28, 16, 8)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.tie_word_embeddings) == (128, 3072, True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (128,) and attn.k_norm.weight.shape == (128,)  # qk-norm


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_builds_with_our_attention(family):
    cfg = dataclasses.replace(presets["tiny"], family=family)
    model = build_model(cfg, AttentionConfig(bias="plsh"), device="meta", dtype=torch.bfloat16)
    assert model.config._attn_implementation == "plsh_dist"
    assert type(model).__name__.lower().startswith(family)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config.use_cache is False
    assert getattr(model.config, "sliding_window", None) is None
    # Only Qwen3 has qk-norm, as upstream.
    assert hasattr(model.model.layers[0].self_attn, "q_norm") == (family == "qwen3")
