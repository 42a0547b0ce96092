"""capture_qkv on a tiny random Qwen3: shapes, and q/k/v equal to what attention receives."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AttentionInterface, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb  # noqa: E402

from experiments.approximation.qkv_capture import capture_qkv  # noqa: E402

B, T = 2, 12


def _tiny_qwen3() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64)
    return Qwen3ForCausalLM(cfg).eval()


def test_shapes_and_layer_selection():
    model = _tiny_qwen3()
    ids = torch.randint(0, 128, (B, T))
    all_layers = capture_qkv(model, ids)
    assert len(all_layers) == 2
    for q, k, v in all_layers:
        assert q.shape == (B, T, 4, 16) and k.shape == (B, T, 2, 16) and v.shape == (B, T, 2, 16)
    (q1, k1, v1), = capture_qkv(model, ids, layers=[1])
    assert torch.equal(q1, all_layers[1][0]) and torch.equal(v1, all_layers[1][2])
    with pytest.raises(ValueError, match="out of range"):
        capture_qkv(model, ids, layers=[2])


def test_matches_the_attention_inputs():
    """Rotating the captured q/k with the model's own rotary gives exactly what attention is called with."""
    seen = []

    def record(module, query, key, value, attention_mask, **kwargs):
        seen.append((query.detach(), key.detach(), value.detach()))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("plsh_test_record", record)
    model = _tiny_qwen3()
    model.set_attn_implementation("plsh_test_record")
    ids = torch.randint(0, 128, (B, T))
    captured = capture_qkv(model, ids)
    assert len(seen) == 2  # one forward, two layers
    cos, sin = model.model.rotary_emb(captured[0][2], torch.arange(T)[None].expand(B, T))
    for (q, k, v), (q_ref, k_ref, v_ref) in zip(captured, seen):
        q_rot, k_rot = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        # Same float32 ops in the same order as the module: exact.
        assert torch.equal(v.transpose(1, 2), v_ref)
        torch.testing.assert_close(q_rot, q_ref, rtol=0, atol=0)
        torch.testing.assert_close(k_rot, k_ref, rtol=0, atol=0)
    # The hooks are gone: another forward records nothing new in capture's dict.
    assert all(not m._forward_hooks for m in model.modules())
