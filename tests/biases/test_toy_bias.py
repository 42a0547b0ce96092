"""A new bias is one file and one registry line: this file is that file.

``HardWindow`` (plain attention over the last ``window`` keys, no decay) is written here against
the :class:`~plsh_dist.biases.base.Bias` interface alone, from public ops, and registered with one
line. Then the rest of the package takes it as it takes the shipped biases: the config and its
checks, the evaluation spec, the model's forward and backward (against the dense fp64 reference
of its own ``reference_weights``), the KV-cache decoding, the compiled op, and the planner.
"""

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from plsh_dist.biases import BIASES, AttentionCall, Bias, register_bias
from plsh_dist.biases.cost import BiasCost, CallShape
from plsh_dist.biases.window import window_pairs
from plsh_dist.distributed.halo import window_needs
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.ops import alibi_attention
from plsh_dist.ops.alibi import alibi_attention_op
from plsh_dist.ops.alibi_kernel import choose_alibi_kernel
from plsh_dist.ops.decode import alibi_decode
from plsh_dist.ops.reference import alibi_weights


class HardWindowCost(BiasCost):
    """Its cost for the planner: the window's pairs, the windowed path's CUDA workspace, a halo."""

    def pairs_per_head(self, T):
        return window_pairs(T, (self.setup.window,) * len(self.setup.sigma))

    def workspace_cuda(self, shape):
        return BIASES["window"].cost_model(self.bias, self.setup).workspace_cuda(shape)

    def sp_needs(self, chunks, shape, seed):
        return window_needs(self.setup.window, chunks, shape.kv_heads, causal=True)


class HardWindow(Bias):
    """No decay, no keys ``window`` or more positions back."""

    name = spec = "hard_window"
    options = {"w": "window", "rope": "rope"}
    positional = "window"
    fields = ("window", "rope")
    summary = "plain attention on a sliding window (a test's bias)"
    cost_model = HardWindowCost

    def one_process(self, call: AttentionCall, seeds) -> torch.Tensor:
        return alibi_attention(call.q, call.k, call.v, slopes=torch.zeros(call.num_heads), window=self.cfg.window,
                               **call.common())

    def compiled(self, call: AttentionCall, seeds) -> torch.Tensor:
        return alibi_attention_op(call.q, call.k, call.v, call.positions, call.cu_seqlens, torch.zeros(call.num_heads),
                                  [self.cfg.window], True, call.scale, None,
                                  choose_alibi_kernel(call.q.device, call.q.dtype, None), True)[0]

    def sequence_parallel(self, call: AttentionCall, seeds) -> torch.Tensor:
        return sp_attention.alibi_attention(call.q, call.k, call.v, group=call.group, slopes=torch.zeros(call.num_heads),
                                            window=self.cfg.window, **call.common())

    def decode(self, q, k, v, q_pos, k_pos, scale, seeds) -> torch.Tensor:
        return alibi_decode(q, k, v, q_pos, k_pos, slopes=torch.zeros(q.shape[2]), window=self.cfg.window,
                            scale=scale)

    def key_window(self, num_heads):
        return self.cfg.window

    def reference_weights(self, positions, num_heads, seed):
        return alibi_weights(torch.zeros(num_heads), positions, window=self.cfg.window)


@pytest.fixture
def toy():
    register_bias(HardWindow)  # the one registry line
    yield HardWindow
    del BIASES[HardWindow.name]


def test_config_and_spec(toy):
    from plsh_dist.eval.mode_specs import parse_modes, spec_usage
    from plsh_dist.models import AttentionConfig

    assert AttentionConfig(bias="hard_window", window=6).bias == "hard_window"
    (mode,) = parse_modes("hard_window:6")
    assert (mode.bias, mode.overrides, mode.stochastic) == ("hard_window", {"window": 6}, False)
    assert "hard_window:W[:rope=true|false]" not in spec_usage() and "hard_window:W" in spec_usage()


def _model():
    from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, presets

    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    return build_model(cfg, AttentionConfig(bias="hard_window", window=6), AttentionRuntime(run_seed=3),
                       dtype=torch.float64)


def test_model_forward_and_backward_match_its_reference(toy):
    from tests.models.model_refs import DENSE_REF
    from tests.tolerances import FP64

    model = _model()
    ids = torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(1))

    def run():
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), [p.grad.clone() for p in model.parameters()]

    ours = run()
    model.set_attn_implementation(DENSE_REF)
    ref = run()
    torch.testing.assert_close(ours[0], ref[0], **FP64)
    for a, b in zip(ours[1], ref[1]):
        torch.testing.assert_close(a, b, **FP64)
    # the window matters: plain causal attention differs
    assert not torch.allclose(ours[0], _causal_logits(model, ids))


def _causal_logits(model, ids):
    from plsh_dist.models import AttentionConfig, set_attention_mode

    set_attention_mode(model, AttentionConfig(bias="none"))
    with torch.no_grad():
        return model(ids).logits


def test_decoding_gives_the_full_forwards_rows(toy):
    model = _model().eval()
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        model(ids[:, :9], cache=cache, use_cache=True)
        steps = [model(ids[:, i:i + 1], cache=cache, use_cache=True).logits for i in range(9, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 9:], rtol=1e-12, atol=1e-12)


def test_compiled_layer_keeps_one_graph(toy):
    model = _model()
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        eager = model(ids).logits
        from plsh_dist.models import compile_layers

        compile_layers(model, backend="eager")  # fullgraph: a graph break would raise
        compiled = model(ids).logits
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)


def test_planner_costs_it(toy):
    from plsh_dist.models import AttentionConfig
    from plsh_dist.plan.attention_cost import attention_cost, workspace_cuda
    from plsh_dist.plan.halo_traffic import sp_traffic

    attn = AttentionConfig(bias="hard_window", window=8)
    cost = attention_cost(attn, 4, "cpu", torch.float32)
    assert isinstance(cost, HardWindowCost)
    assert cost.pairs_per_head(20) == [float(torch.clamp(torch.arange(20) + 1, max=8).sum())] * 4
    assert workspace_cuda(cost, CallShape(1, 64, 64, 4, 2, 16, 2)).forward > 0
    traffic = sp_traffic(cost, attn, run_seed=0, layers=2, sp=2, tokens=32, batch=1, q_heads=4, kv_heads=2,
                         head_dim=16, b=2)
    assert traffic[0].recv_tokens_max == 7 * 2  # the window's 7 keys before the chunk, per kv head
