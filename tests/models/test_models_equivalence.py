"""With bias 'none' and rope on, our attention path is transformers' attention:
same logits and same gradients of every parameter (fp32, CPU, tiny models)."""

import dataclasses

import pytest
import torch

from plsh_dist.models import AttentionConfig, build_model, presets, set_attention_mode
from tests.tolerances import FP32

# fp32 on both sides (tests/tolerances.py: FP32). Measured: bit-identical to
# "sdpa" (our no-bias path is SDPA in a single process), 5e-7 on O(1) logits
# and 1.2e-7 on O(0.2) grads against "eager" (another summation order); a
# wrong mask or position moves logits by > 1e-2.


def _run(model, ids, position_ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, position_ids=position_ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out.logits.detach(), grads


def _compare(model, reference_impl, position_ids):
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    set_attention_mode(model, AttentionConfig(bias="none", rope=True))
    ours = _run(model, ids, position_ids)
    model.set_attn_implementation(reference_impl)
    theirs = _run(model, ids, position_ids)
    torch.testing.assert_close(ours[0], theirs[0], **FP32)
    assert ours[1].keys() == theirs[1].keys() and len(ours[1]) == len(list(model.parameters()))
    for name in ours[1]:
        torch.testing.assert_close(ours[1][name], theirs[1][name], **FP32, msg=name)


@pytest.mark.parametrize("reference_impl", ["sdpa", "eager"])
@pytest.mark.parametrize("offset", [0, 1000])  # global positions, as a later SP rank sees them
def test_qwen3_matches_transformers(reference_impl, offset):
    torch.manual_seed(0)
    model = build_model(presets["tiny"], AttentionConfig(bias="none", rope=True))
    _compare(model, reference_impl, torch.arange(offset, offset + 24)[None].expand(2, -1))


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_other_families_match_transformers(family):
    """Model loaded the transformers way (sdpa), then switched to ours."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], family=family, num_layers=2)
    hf_cfg = cfg.to_hf_config(attn_implementation="sdpa")
    import transformers

    model = getattr(transformers, f"{type(hf_cfg).__name__[:-6]}ForCausalLM")(hf_cfg)
    _compare(model, "sdpa", None)
