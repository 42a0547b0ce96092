"""torch.compile of the attention ops and of whole decoder layers (the ops as torch.library custom ops).

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
from plsh_dist.models import build_model, compile_layers, get_runtime, presets
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
    """The issue's reproducers: plsh_attention and truncated alibi_attention under fullgraph, its window as
    ints or as a tensor."""
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
        "truncated_tensor": lambda q, k, v: ops.alibi_attention(q, k, v, slopes=slopes,
                                                               window=torch.tensor([2, 4, 8, 16]), return_lse=True),
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


def test_alibi_window_as_a_tensor_input_compiles_with_fullgraph():
    """A window tensor that is an input of the compiled function: its values are graph data, checked inside
    the op (no guard on them, no graph break), and the result is the ints' (a window, and one per head)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 48, H, 16, generator=g) for H in (4, 2, 2))
    slopes = alibi_slopes(4)

    def fn(q, k, v, window):
        return ops.alibi_attention(q, k, v, slopes=slopes, window=window, return_lse=True)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for ints in ((3, 5, 9, 17), (6, 6, 6, 6)):
        want = fn(q, k, v, ints)
        for got in (fn(q, k, v, torch.tensor(ints)), compiled(q, k, v, torch.tensor(ints))):
            _assert_close(list(got), list(want))
    with pytest.raises(ValueError, match="one int >= 1 per query head"):
        fn(q, k, v, torch.tensor([3, 0, 9, 17]))


def test_compiled_layers_share_one_graph():
    """compile_layers: every decoder layer compiled in place, one graph for all of them (the layer
    index and the step are inputs, not constants: a model of many layers stays under dynamo's
    recompile limit), logits and gradients as eager's."""
    torch.manual_seed(0)
    model = build_model(presets["tiny"], AttentionConfig(**BIASES["plsh_onepass"]), AttentionRuntime(run_seed=1))
    ids = torch.randint(0, 512, (B, T))
    position_ids = torch.arange(T)[None].repeat(B, 1)

    def logits_and_grads():
        model.zero_grad()
        logits = model(input_ids=ids, position_ids=position_ids).logits
        logits.pow(2).mean().backward()
        return [logits.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    runtime = get_runtime(model)
    eager = []
    for step in (0, 1):
        with runtime.at(step):
            eager.append(logits_and_grads())
    counter = CompileCounterWithBackend("aot_eager")
    compile_layers(model, counter)
    for step in (0, 1):
        with runtime.at(step):
            _assert_close(logits_and_grads(), eager[step])
    assert counter.frame_count == 1
    assert not torch.equal(eager[0][0], eager[1][0])


@pytest.mark.parametrize("documents", [False, True])
def test_op_backward_remakes_the_varlen_calls(documents):
    """The CUDA per-sample strategy keeps its varlen calls from forward to backward; the op keeps
    tensors only, so its backward makes them again (run here on the CPU reference provider):
    gradients equal those of the autograd Function that keeps them."""
    from plsh_dist.ops import plsh as plsh_module
    from plsh_dist.ops.plsh import block_attention_op
    from plsh_dist.ops.backends import VARLEN_REFERENCE
    from plsh_dist.ops.documents import BatchRows, flat_documents
    from plsh_dist.hashing import PositionalLSH

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 30, H, 8, generator=g, dtype=torch.float64, requires_grad=True) for H in (2, 1, 1))
    cu = torch.tensor([0, 12, 30, 41, 60], dtype=torch.int32) if documents else None
    sigma = torch.tensor([3.0, 7.0], dtype=torch.float64)
    out, _ = block_attention_op(q, k, v, None, cu, torch.tensor(4), sigma, 3, "iid", False, True, None,
                                "VarlenPerSample(REFERENCE)", False)
    got = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    lsh = PositionalLSH(sigma, 3, 4)
    if documents:
        docs = flat_documents(None, cu, 2, 30)
        rows = BatchRows.of(q, flat=True)
        ref, _ = rows.outputs(*plsh_module.PLSHAttentionFunction.apply(*rows.inputs(q, k, v), lsh, docs.positions,
                                                                       True, 8**-0.5, VARLEN_REFERENCE, docs))
    else:
        ref, _ = plsh_module.PLSHAttentionFunction.apply(q, k, v, lsh, torch.arange(30), True, 8**-0.5,
                                                         VARLEN_REFERENCE)
    want = torch.autograd.grad(ref.pow(2).sum(), (q, k, v))
    assert torch.equal(out, ref)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
