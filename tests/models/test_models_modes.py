"""One vocabulary of attention modes (plsh_dist.models.modes.MODES) behind the config, the
attention function's bias table, evaluation specs and the replication grid."""

import pytest

from plsh_dist.eval.mode_specs import attention_for, parse_modes
from plsh_dist.models import BIASES, AttentionConfig
from plsh_dist.models.attention import BIAS_FUNCTIONS
from plsh_dist.models.modes import MODES


def test_every_mode_is_a_config_bias_with_forward_and_decode_functions():
    assert BIASES == tuple(MODES) == ("none", "alibi", "plsh", "fixed_blocks", "window", "truncated")
    assert set(BIAS_FUNCTIONS) == set(BIASES)
    for bias in BIASES:
        AttentionConfig(bias=bias)
        assert callable(BIAS_FUNCTIONS[bias].forward) and callable(BIAS_FUNCTIONS[bias].decode)


@pytest.mark.parametrize("mode", MODES.values(), ids=lambda m: m.bias)
def test_evaluation_specs_name_every_mode(mode):
    for name in (mode.spec, *mode.aliases):
        spec = f"{name}:512" if mode.bias == "window" else name
        (parsed,) = parse_modes(spec)
        assert parsed.bias == mode.bias and parsed.stochastic == mode.seeded
        assert attention_for(parsed, AttentionConfig()).bias == mode.bias


def test_only_plsh_is_seeded():
    assert [m.bias for m in MODES.values() if m.seeded] == ["plsh"]


def test_replication_grid_uses_the_vocabulary():
    from experiments.replicate import MODES as GRID

    for overrides, spec in GRID.values():
        bias = next(o.split("=", 1)[1] for o in overrides if o.startswith("--attention.bias="))
        assert spec == MODES[bias].spec


def test_forward_and_decoding_go_through_the_one_bias_table(monkeypatch):
    import dataclasses

    import torch
    from transformers import DynamicCache

    from plsh_dist.models import build_model, presets
    from plsh_dist.models import attention as attention_mod

    calls = []

    def forward(b, ops, q, k, v, common):
        calls.append(("forward", b.layer, q.shape[1]))
        return torch.zeros_like(q)

    def decode(b, q, k, v, q_pos, k_pos, scale):
        calls.append(("decode", b.layer, q.shape[1]))
        return torch.zeros_like(q)

    monkeypatch.setitem(attention_mod.BIAS_FUNCTIONS, "window", attention_mod.BiasFunctions(forward, decode))
    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    model = build_model(cfg, AttentionConfig(bias="window", window=4)).eval()
    ids = torch.randint(0, 512, (1, 6))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :5], cache=cache, use_cache=True)
        model(input_ids=ids[:, 5:], cache=cache, use_cache=True)
    assert calls == [("forward", 0, 5), ("forward", 1, 5), ("decode", 0, 1), ("decode", 1, 1)]
