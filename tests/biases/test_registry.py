"""One registry of attention biases (plsh_dist.biases.BIASES) behind the config, the attention
hook, evaluation specs, the planner and the replication grid."""

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from plsh_dist.biases import BIASES, Bias, bias_class, bias_for, register_bias
from plsh_dist.biases.cost import BiasCost
from plsh_dist.eval.mode_specs import attention_for, parse_modes
from plsh_dist.models import AttentionConfig, build_model, presets


def test_every_bias_is_a_config_bias_with_its_forms_and_decoding():
    assert tuple(BIASES) == ("none", "alibi", "plsh", "fixed_blocks", "window", "truncated")
    for name, cls in BIASES.items():
        assert cls.name == name and issubclass(cls, Bias)
        bias = bias_for(AttentionConfig(bias=name))
        assert type(bias) is cls and all(hasattr(bias.cfg, f) for f in cls.fields)
        for method in ("one_process", "sequence_parallel", "decode", "reference_weights"):
            assert getattr(cls, method) is not getattr(Bias, method), (name, method)  # each implements it
        for method in ("pairs_per_head", "workspace_cuda"):  # its cost model counts its own
            assert getattr(cls.cost_model, method) is not getattr(BiasCost, method), (name, method)
        assert cls.forward is Bias.forward, name  # the choice of form is the base class's alone


def test_an_unknown_bias_names_the_known_ones():
    with pytest.raises(ValueError, match=r"attention.bias must be one of \('none', 'alibi'"):
        AttentionConfig(bias="kerple")
    with pytest.raises(ValueError, match="attention.bias must be one of"):
        bias_class("kerple")


@pytest.mark.parametrize("cls", BIASES.values(), ids=lambda c: c.name)
def test_evaluation_specs_name_every_bias(cls):
    for name in (cls.spec, *cls.aliases):
        spec = f"{name}:512" if cls.positional else name
        (parsed,) = parse_modes(spec)
        assert parsed.bias == cls.name and parsed.stochastic == cls.seeded
        assert attention_for(parsed, AttentionConfig()).bias == cls.name


def test_only_plsh_is_seeded():
    assert [c.name for c in BIASES.values() if c.seeded] == ["plsh"]


def test_a_spec_name_cannot_be_registered_twice():
    class Clash(Bias):
        name, spec = "clash", "alibi"

    with pytest.raises(ValueError, match="already registered"):
        register_bias(Clash)
    assert "clash" not in BIASES
    with pytest.raises(ValueError, match="Bias subclass"):
        register_bias(object)


def test_replication_grid_uses_the_vocabulary():
    from experiments.replicate import MODES as GRID

    for overrides, spec in GRID.values():
        bias = next(o.split("=", 1)[1] for o in overrides if o.startswith("--attention.bias="))
        assert spec == BIASES[bias].spec


def test_forward_and_decoding_go_through_the_bias_object(monkeypatch):
    calls = []

    def forward(self, call, seeds):
        calls.append(("forward", seeds.layer, call.q.shape[1]))
        return torch.zeros_like(call.q)

    def decode(self, q, k, v, q_pos, k_pos, scale, seeds):
        calls.append(("decode", seeds.layer, q.shape[1]))
        return torch.zeros_like(q)

    cls = BIASES["window"]
    monkeypatch.setattr(cls, "one_process", forward)  # the form an eager call of one process takes
    monkeypatch.setattr(cls, "decode", decode)
    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    model = build_model(cfg, AttentionConfig(bias="window", window=4)).eval()
    ids = torch.randint(0, 512, (1, 6))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :5], cache=cache, use_cache=True)
        model(input_ids=ids[:, 5:], cache=cache, use_cache=True)
    assert calls == [("forward", 0, 5), ("forward", 1, 5), ("decode", 0, 1), ("decode", 1, 1)]
