"""torch.compile of the attention ops and of whole decoder layers (plsh_dist.ops.custom_ops).

The attention is one custom op per call (fake kernel + registered autograd), so a
decoder layer of every bias compiles with ``fullgraph=True`` and no graph break, and
its output and gradients equal eager's to the op tests' fp32 tolerance. The per-bias
checks use ``backend="aot_eager"``: dynamo and AOTAutograd trace the layer with the
fake kernels and the autograd formulas (what inductor sees) without inductor's C++
code generation, which costs tens of seconds per graph on a CPU; inductor itself runs
for one bias. A new step's seed is an input of the graph, not a constant: no recompile.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

from plsh_dist import ops
from plsh_dist.hashing import alibi_slopes
from plsh_dist.models import build_model, get_runtime, presets
from plsh_dist.models.config import AttentionConfig
from plsh_dist.models.runtime import AttentionRuntime
from tests.tolerances import FP32

BIASES = {
    "none": dict(bias="none"),
    "none_rope": dict(bias="none", rope=True),
    "alibi": dict(bias="alibi"),
    "window": dict(bias="window", window=16),
    "truncated": dict(bias="truncated", num_samples=4),
    "plsh_onepass": dict(bias="plsh", num_samples=4, method="onepass"),
    "plsh_per_sample": dict(bias="plsh", num_samples=4, method="per_sample"),
    "fixed_blocks": dict(bias="fixed_blocks"),
}
B, T = 2, 48


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _layer_call(attn: dict, documents: bool = False):
    """Layer 1 of the tiny Qwen3 as ``f(h) -> hidden states``, its input (B, T, hidden) and the model."""
    torch.manual_seed(0)
    model = build_model(presets["tiny"], AttentionConfig(**attn), AttentionRuntime(run_seed=1))
    decoder = model.get_decoder()
    h = torch.randn(B, T, model.config.hidden_size, requires_grad=True)
    position_ids = torch.arange(T)[None].repeat(B, 1)
    if documents:  # row 1 packs two documents: positions restart at token 20
        position_ids[1, 20:] -= 20
    cos_sin = decoder.rotary_emb(h, position_ids)
    layer = decoder.layers[1]

    def f(x):
        out = layer(x, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out

    return f, h, model


def _output_and_grads(f, h, model):
    model.zero_grad()
    h.grad = None
    out = f(h)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return [out.detach(), h.grad.clone()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _assert_close(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **FP32)


@pytest.mark.parametrize("name", list(BIASES))
def test_decoder_layer_compiles_to_one_graph(name):
    f, h, model = _layer_call(BIASES[name])
    explained = torch._dynamo.explain(f)(h)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    torch._dynamo.reset()
    eager = _output_and_grads(f, h, model)
    compiled = _output_and_grads(torch.compile(f, backend="aot_eager", fullgraph=True), h, model)
    _assert_close(compiled, eager)


@pytest.mark.parametrize("name", ["plsh_onepass", "truncated", "none"])
def test_packed_documents_are_laid_out_inside_the_op(name):
    """position_ids restarting inside a row: the layout (host integers) is made in the op."""
    f, h, model = _layer_call(BIASES[name], documents=True)
    eager = _output_and_grads(f, h, model)
    compiled = _output_and_grads(torch.compile(f, backend="aot_eager", fullgraph=True), h, model)
    _assert_close(compiled, eager)


def test_a_new_step_draws_new_masks_without_recompiling():
    f, h, model = _layer_call(BIASES["plsh_onepass"])
    runtime = get_runtime(model)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    outs = []
    for step in (0, 1, 0):
        with runtime.at(step):
            eager = _output_and_grads(f, h, model)
            _assert_close(_output_and_grads(compiled, h, model), eager)
            outs.append(eager[0])
    assert counter.frame_count == 1
    assert not torch.allclose(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_inductor_compiles_a_plsh_layer():
    """The default backend (C++ code generation) on one bias; the others run under aot_eager above."""
    f, h, model = _layer_call(BIASES["plsh_onepass"])
    eager = _output_and_grads(f, h, model)
    _assert_close(_output_and_grads(torch.compile(f, fullgraph=True), h, model), eager)


def test_public_ops_compile_with_fullgraph():
    """The issue's reproducers: plsh_attention and truncated alibi_attention under fullgraph."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 40, H, 16, generator=g, requires_grad=True) for H in (4, 2, 2))
    slopes = alibi_slopes(4)
    cu = torch.tensor([0, 15, 40, 80], dtype=torch.int32)
    calls = {
        "plsh": lambda q, k, v: ops.plsh_attention(q, k, v, sigma=slopes.reciprocal(), num_samples=3, seed=7,
                                                  return_lse=True),
        "plsh_documents": lambda q, k, v: ops.plsh_attention(q, k, v, sigma=8.0, num_samples=2, seed=7,
                                                            method="per_sample", cu_seqlens=cu, return_lse=True),
        "truncated": lambda q, k, v: ops.alibi_attention(q, k, v, slopes=slopes, window=(2, 4, 8, 16),
                                                        return_lse=True),
        "fixed_blocks": lambda q, k, v: ops.fixed_blocks_attention(q, k, v, sigma=slopes.reciprocal(),
                                                                  return_lse=True),
    }
    for name, fn in calls.items():
        torch._dynamo.reset()
        results = []
        for run in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
            for x in (q, k, v):
                x.grad = None
            out, lse = run(q, k, v)
            assert out.shape == q.shape and lse.shape == (2, 4, 40) and lse.dtype == torch.float32, name
            assert not lse.requires_grad, name
            out.pow(2).sum().backward()
            results.append([out.detach(), lse, q.grad, k.grad, v.grad])
        _assert_close(results[1], results[0])
