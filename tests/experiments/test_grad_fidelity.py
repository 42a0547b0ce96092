"""Gradient fidelity: PLSH's training gradient approaches exact ALiBi's as s grows, and the measurement is
deterministic (the training seed rule)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from experiments.grad_fidelity import fixed_batch, format_fidelity, gradient_fidelity, loss_and_grad
from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, presets


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], vocab_size=64, num_layers=2)
    attn = AttentionConfig(bias="plsh", num_samples=4, rope=False)
    model = build_model(cfg, attn, AttentionRuntime(run_seed=0))
    tokens = np.random.default_rng(0).integers(0, 64, 4000)
    return model, attn, fixed_batch(tokens, 48, 2)


def test_the_gradient_approaches_alibi_as_s_grows(setup):
    model, attn, windows = setup
    res = gradient_fidelity(model, attn, windows, [1, 256], ["iid"], draws=2)
    few, many = res["rows"]
    assert many["cos_step"] > few["cos_step"] and many["cos_step"] > 0.99
    assert abs(many["excess_loss"]) < abs(few["excess_loss"])
    assert abs(many["norm_ratio"] - 1) < 0.05
    assert "| 256 | iid |" in format_fidelity(res)


def test_the_reference_is_exact_alibi_with_the_models_sigma(setup):
    model, attn, windows = setup
    res = gradient_fidelity(model, attn, windows, [2], ["iid"], draws=1)
    loss, _ = loss_and_grad(model, dataclasses.replace(attn, bias="alibi"), windows, 0)
    assert res["reference"]["loss"] == loss


def test_repeatable_and_the_model_returns_to_its_trained_attention(setup):
    model, attn, windows = setup
    a = gradient_fidelity(model, attn, windows, [3], ["iid", "stratified_ramp"], draws=2)
    b = gradient_fidelity(model, attn, windows, [3], ["iid", "stratified_ramp"], draws=2)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in a["rows"]]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in b["rows"]]
    loss_trained, _ = loss_and_grad(model, attn, windows, 0)
    loss_again, _ = loss_and_grad(model, attn, windows, 0)
    assert loss_trained == loss_again


def test_too_little_data_is_refused():
    with pytest.raises(ValueError, match="seq-len"):
        fixed_batch(np.arange(10), 48, 2)
