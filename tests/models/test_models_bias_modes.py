"""Every bias mode runs forward + backward through a whole model and equals a
dense fp64 reference built from the public hash / ALiBi definitions."""

import dataclasses

import pytest
import torch
from transformers.masking_utils import create_causal_mask

from plsh_dist.models import (AttentionConfig, AttentionRuntime, apply_activation_checkpointing, build_model, get_runtime,
                              presets, set_attention_mode)

from tests.models.model_refs import DENSE_REF
from tests.tolerances import FP64

# Both sides in float64 with the same weights; only summation order differs
# (tests/tolerances.py: FP64). Measured: logits equal, grads within 5e-17.
T = 40

MODES = [
    AttentionConfig(bias="none", rope=True),
    AttentionConfig(bias="alibi"),
    AttentionConfig(bias="alibi", sigma=8.0, chunk_size=16),
    AttentionConfig(bias="window", window=12),
    AttentionConfig(bias="truncated", truncate_c=1.5),  # per-head windows 6, 24, 96, 384
    AttentionConfig(bias="truncated", sigma=8.0, num_samples=2),  # c = ln 2 + 0.58: w = 11 on every head
    AttentionConfig(bias="plsh", num_samples=4),  # per-head sigma 4, 16, 64, 256
    AttentionConfig(bias="plsh", num_samples=3, sigma=6.0, sampler="stratified"),
    AttentionConfig(bias="plsh", num_samples=2, fixed_masks=True),
    AttentionConfig(bias="fixed_blocks"),
    AttentionConfig(bias="fixed_blocks", sigma=5.0),
]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    # Two layers: enough for per-layer seeds, half the CPU time of the preset's four.
    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    return build_model(cfg, AttentionConfig(), AttentionRuntime(run_seed=11), dtype=torch.float64)


def _run(model, ids, position_ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, position_ids=position_ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("cfg", MODES, ids=lambda c: f"{c.bias}-{c.sigma}-{c.sampler}-{c.fixed_masks}")
def test_mode_matches_dense_reference(model, cfg):
    set_attention_mode(model, cfg)
    get_runtime(model).set_step(5, 2)
    torch.manual_seed(2)
    ids = torch.randint(0, 512, (2, T))
    position_ids = (300 + torch.arange(T))[None].expand(2, -1)  # global positions of a later chunk
    ours = _run(model, ids, position_ids)
    model.set_attn_implementation(DENSE_REF)
    ref = _run(model, ids, position_ids)
    torch.testing.assert_close(ours[0], ref[0], **FP64)
    for name, grad in ours[1].items():
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, ref[1][name], **FP64, msg=name)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_plsh_masks_fresh_per_step_reproducible_and_fixable(model):
    ids = torch.randint(0, 512, (1, T))
    set_attention_mode(model, AttentionConfig(bias="plsh", num_samples=1))
    rt = get_runtime(model)
    rt.set_step(0, 0)
    a = _logits(model, ids)
    assert torch.equal(a, _logits(model, ids))  # same (seed, step, micro): same masks
    rt.set_step(0, 1)
    assert not torch.allclose(a, _logits(model, ids))  # new micro-step: new masks
    set_attention_mode(model, AttentionConfig(bias="plsh", num_samples=1, fixed_masks=True))
    rt.set_step(0, 0)
    b = _logits(model, ids)
    rt.set_step(9, 3)
    assert torch.equal(b, _logits(model, ids))  # fixed masks ignore the step
    set_attention_mode(model, AttentionConfig(bias="plsh", num_samples=1), AttentionRuntime(run_seed=12))
    assert not torch.allclose(a, _logits(model, ids))  # another run seed: other masks


def test_no_dense_mask_is_built_and_bad_inputs_are_refused(model):
    set_attention_mode(model, AttentionConfig(bias="alibi"))
    ids = torch.randint(0, 512, (2, 8))
    embeds = model.model.embed_tokens(ids)
    mask = create_causal_mask(
        config=model.config, inputs_embeds=embeds, attention_mask=None, cache=None,
        position_ids=torch.arange(8)[None],
    )
    assert mask is None
    with torch.no_grad():
        model(ids, attention_mask=torch.ones(2, 8, dtype=torch.long))  # all-ones mask is fine
        with pytest.raises(ValueError, match="materialised 4-D"):  # padding is supported (test_padding.py)
            model(ids, attention_mask=torch.ones(2, 1, 8, 8, dtype=torch.bool))
        with pytest.raises(ValueError, match="within each document"):  # decreasing positions, not a packed row
            model(ids, position_ids=torch.stack([torch.arange(8), torch.arange(8).flip(0)]))


def test_activation_checkpointing_replays_the_masks():
    """The recomputed forward must draw the forward's masks (same runtime step):
    gradients with checkpointing equal those without, bit for bit up to op order."""
    torch.manual_seed(0)
    model = build_model(presets["tiny"], AttentionConfig(bias="plsh", num_samples=2), dtype=torch.float64)
    model.train()
    get_runtime(model).set_step(3, 0)
    ids = torch.randint(0, 512, (1, T))
    plain = _run(model, ids, None)
    apply_activation_checkpointing(model, "full")
    ckpt = _run(model, ids, None)
    torch.testing.assert_close(plain[0], ckpt[0], atol=0, rtol=0)
    for name, grad in plain[1].items():
        torch.testing.assert_close(grad, ckpt[1][name], **FP64, msg=name)
