"""Rope off removes the rotation exactly; rope on keeps transformers' rotation."""

import pytest
import torch
from transformers import AttentionInterface

from plsh_dist.models import AttentionConfig, build_model, presets, rope_enabled, set_attention_mode

from tests.models.model_refs import DENSE_REF, dense_reference_attention

CAPTURE = "plsh_dist_test_capture"
_captured = {}


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    _captured[module.layer_idx] = (query.detach().clone(), key.detach().clone())
    return dense_reference_attention(module, query, key, value, attention_mask, **kwargs)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    AttentionInterface.register(CAPTURE, _capture_attention)
    return build_model(presets["tiny"], AttentionConfig(bias="none", rope=False))


def _projections(model, ids):
    """q, k of layer 0 straight from the projections (+ qk-norm), (B, H, T, D)."""
    layer = model.model.layers[0]
    attn = layer.self_attn
    h = layer.input_layernorm(model.model.embed_tokens(ids))
    shape = (*ids.shape, -1, attn.head_dim)
    q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
    return q, k


@pytest.mark.parametrize("rope", [False, True])
def test_q_k_entering_attention(model, rope):
    set_attention_mode(model, AttentionConfig(bias="none", rope=rope))
    assert rope_enabled(model) is rope
    model.set_attn_implementation(CAPTURE)
    ids = torch.randint(0, 512, (2, 12))
    with torch.no_grad():
        model(ids, position_ids=torch.arange(100, 112)[None].expand(2, -1))
        q, k = _projections(model, ids)
    got_q, got_k = _captured[0]
    if rope:
        assert not torch.allclose(got_q, q) and not torch.allclose(got_k, k)
    else:
        # cos = 1, sin = 0: q * 1 + rotate_half(q) * 0 is q bit for bit.
        assert torch.equal(got_q, q) and torch.equal(got_k, k)


@pytest.mark.parametrize("rope", [False, True])
def test_positions_matter_only_with_rope(model, rope):
    """bias 'none': positions enter only through rope, so gapped positions change
    the logits with rope on and leave them bit-identical with rope off."""
    set_attention_mode(model, AttentionConfig(bias="none", rope=rope))
    model.set_attn_implementation(DENSE_REF)
    ids = torch.randint(0, 512, (1, 16))
    gapped = torch.cumsum(torch.randint(1, 9, (16,)), 0)[None]
    with torch.no_grad():
        a = model(ids, position_ids=torch.arange(16)[None]).logits
        b = model(ids, position_ids=gapped).logits
    assert torch.equal(a, b) is (not rope)
