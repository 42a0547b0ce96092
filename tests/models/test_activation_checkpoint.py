"""Our per-layer activation checkpointing (``apply_activation_checkpointing``), eager and compiled.

A checkpointed decoder layer (full or selective) gives the outputs and gradients of the same layer
without checkpointing bit for bit (``torch.equal``), eagerly and compiled (``aot_eager``; inductor
once): the recompute runs the forward's ops on the same inputs, with the forward's hash (a PLSH
layer, so another hash would change every gradient), also when the backward runs at another step
of the seed context. Compiled, the checkpoint is one region of the layer's single graph
(``fullgraph``, no break). What each mode recomputes is checked too (the matmuls the backward
runs; the tensors a compiled layer keeps), and parameter names / ``state_dict`` keys do not change.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

from plsh_dist.models import (apply_activation_checkpointing, build_model, compile_layers, get_runtime,
                              presets)
from plsh_dist.models.config import AttentionConfig
from plsh_dist.models.runtime import AttentionRuntime
from tests.models.test_compile import BIASES, _layer_call, _output_and_grads
from tests.tolerances import FP32

PLSH = BIASES["plsh_onepass"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _layer(mode: str, backend="eager", counter=None):
    """``_layer_call``'s layer 1 (same weights and input every call), checkpointed in ``mode`` ("off":
    not) and then, unless ``backend`` is "eager", compiled as the trainer does (``compile_layers``)."""
    f, h, model = _layer_call(PLSH)
    if mode != "off":
        apply_activation_checkpointing(model, mode)
    if backend != "eager":
        compile_layers(model, counter or backend)
    return f, h, model


def _equal(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (i, (a - b).abs().max().item())


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointed_layer_equals_the_plain_one_bit_for_bit(mode, backend):
    """Under aot_eager the checkpointed graph and the plain one run the same aten kernels on the same
    inputs; the recompute only moves ops into the backward graph, so the equality is exact. One graph
    (``fullgraph=True``: a break would raise)."""
    plain = _output_and_grads(*_layer(mode="off", backend=backend))
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend) if backend != "eager" else None
    _equal(_output_and_grads(*_layer(mode, backend, counter)), plain)
    if counter is not None:
        assert counter.frame_count == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_the_recompute_draws_the_forwards_hash(mode, backend):
    """Forward at step 3, backward after the seed context went back to step 0: the gradients are
    step 3's (eager: the recompute re-enters the forward's step; compiled: the seed op's output is
    kept), and step 3's differ from step 0's (the check would see another hash)."""
    f, h, model = _layer_call(PLSH)
    runtime = get_runtime(model)
    with runtime.at(3):
        plain = _output_and_grads(f, h, model)
    at_zero = _output_and_grads(f, h, model)
    assert not torch.equal(plain[1], at_zero[1])
    apply_activation_checkpointing(model, mode)
    if backend != "eager":
        compile_layers(model, backend)
    model.zero_grad()
    h.grad = None
    with runtime.at(3):
        out = f(h)
    assert (runtime.step, runtime.micro_step) == (0, 0)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    got = [out.detach(), h.grad.clone()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    if backend == "eager":
        _equal(got, plain)
    else:  # compiled vs eager: AOTAutograd's decompositions may sum in another order (test_compile.py)
        for a, b in zip(got, plain):
            torch.testing.assert_close(a, b, **FP32)


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.mm += 1
        return func(*args, **(kwargs or {}))


def _backward_matmuls(mode: str) -> int:
    f, h, model = _layer(mode)
    out = f(h)
    with _CountMatmuls() as count:
        out.sum().backward()
    return count.mm


def test_full_recomputes_the_matmuls_and_selective_keeps_them():
    """Eager: full checkpointing reruns the layer's projections in backward (6 of its 7: the recompute
    stops once it has what backward needs, which is not down_proj's output); selective keeps their
    outputs (its recompute runs none), so its backward runs the matmuls of the plain one."""
    plain = _backward_matmuls("off")
    assert _backward_matmuls("full") == plain + 6
    assert _backward_matmuls("selective") == plain


def _kept_bytes(mode: str) -> int:
    """Bytes of the non-parameter tensors a compiled (aot_eager) layer keeps for its backward."""
    torch._dynamo.reset()
    f, h, model = _layer(mode, "aot_eager")
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(h)
    return sum(kept.values())


def test_compiled_layer_keeps_what_its_mode_says():
    """Full: the layer's inputs (hidden states, rotary cos and sin, positions, PLSH's sigma) and the
    8-byte seed (not the step tensor); selective: also the projections' outputs and the attention's
    out and lse; both less than the plain layer."""
    B, T = 2, 48
    inputs = 4 * B * T * (128 + 32 + 32) + 8 * B * T + 8 * 4
    plain, full, selective = (_kept_bytes(m) for m in ("off", "full", "selective"))
    assert full == inputs + 8
    assert full < selective < plain
    # q (128), k, v (64 each), o (128), gate and up (256 each) outputs, attention out (128) and lse (4 heads)
    assert selective == full + 4 * B * T * (128 + 64 + 64 + 128 + 256 + 256 + 128 + 4)


def test_parameter_names_and_state_dict_are_unchanged():
    """No wrapper module: DeepSpeed checkpoints and the universal conversion key on these names, so
    a checkpoint written without checkpointing (or with transformers') loads strictly."""
    def model_():
        torch.manual_seed(0)
        return build_model(presets["tiny"], AttentionConfig(**PLSH), AttentionRuntime(run_seed=1))

    plain = model_()
    for mode in ("full", "selective"):
        model = compile_layers(apply_activation_checkpointing(model_(), mode), "aot_eager")
        assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
        assert list(model.state_dict()) == list(plain.state_dict())
        model.load_state_dict(plain.state_dict(), strict=True)


def test_checkpointing_applied_after_compile_runs_inside_the_compiled_layer():
    """Either order works: after compile_layers, apply_activation_checkpointing recompiles the layer
    with the checkpoint in it (its backward reruns the projections) and the same gradients."""
    counter = CompileCounterWithBackend("aot_eager")
    f, h, model = _layer("off", counter)
    plain = _output_and_grads(f, h, model)
    out = f(h)
    with _CountMatmuls() as plain_count:
        out.sum().backward()
    apply_activation_checkpointing(model, "full")
    _equal(_output_and_grads(f, h, model), plain)
    assert counter.frame_count == 2
    out = f(h)
    with _CountMatmuls() as count:
        out.sum().backward()
    assert count.mm == plain_count.mm + 6


def test_without_gradients_the_layer_is_not_checkpointed():
    f, h, model = _layer("full")
    with torch.no_grad():
        out = f(h)
    assert out.grad_fn is None


@pytest.mark.slow
def test_inductor_checkpointed_layer():
    """inductor once, full mode: bit-equal to inductor without checkpointing (measured, torch 2.13 CPU;
    the recompute is generated in the backward kernels). Slow: C++ code generation of four graphs,
    37 s on a 2-core CPU."""
    plain = _output_and_grads(*_layer("off", "inductor"))
    torch._dynamo.reset()
    _equal(_output_and_grads(*_layer("full", "inductor")), plain)
