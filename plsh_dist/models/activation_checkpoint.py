"""Activation checkpointing per decoder layer, ours rather than transformers' (torchtitan's ``apply_ac``).

Each decoder layer runs its forward inside ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``:

- ``"full"``: the layer keeps its inputs only; backward reruns its whole forward.
- ``"selective"``: op-level selective checkpointing (``create_selective_checkpoint_contexts``): the
  layer keeps the outputs of its matmuls and of the attention op (``plsh_dist::*``: out and lse, and
  the layer's hash seed) and recomputes the cheap ops between them (norms, rotary embedding, the
  MLP's activation, residual adds). No matmul and no attention runs twice.

Applied in place: the layer's ``forward`` becomes an instance attribute that checkpoints the
class's forward; no wrapper module, so parameter names and ``state_dict`` keys are unchanged
(DeepSpeed checkpoints and the universal-checkpoint conversion key on them; checkpoints written
with transformers' checkpointing, or none, resume). The layer's own module hooks (ZeRO-3's
parameter gathering) stay outside the checkpoint, as in transformers' wrapper; its submodules'
run again in the recompute.

With ``compile_layers`` the checkpoint is inside the compiled layer, as torchtitan orders them
(``apply_ac`` then ``apply_compile``): dynamo traces ``checkpoint`` as one region of the layer's
single graph (``fullgraph=True``, no break) and AOTAutograd's partitioner puts the recomputed ops
in the backward graph, where the compiler sees them, and honours the selective policy. The other
order (a compiled layer inside an eager checkpoint) would run the compiled forward twice, and the
selective policy, a dispatch mode, could not see inside a compiled kernel. Transformers' attention
module routes its kernel-hub functions through a global it sets and resets in its forward; dynamo
refuses any such mutation inside ``checkpoint`` unless told that skipping its replay in the
recompute is fine (``skip_fwd_side_effects_in_bwd_under_checkpoint``), which it is here: the value
is restored when the forward ends and only selects functions already traced. The flag is set only
around the checkpointed layer's compiled calls (:func:`allow_recompute_side_effects`).

The recompute draws the forward's hash. Eagerly, the attention reads its seed from the model's
``AttentionRuntime`` (step, micro-step): the checkpointed function re-enters the step of its
forward if the backward runs at another. Compiled, the seed is the op ``plsh_dist::layer_seed``,
whose output is kept (both modes) rather than recomputed from the step tensor. Gradients are
therefore those without checkpointing, bit for bit (tests/models/test_activation_checkpoint.py).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

#: The values ``[memory].activation_checkpointing_mode`` accepts.
AC_MODES = ("full", "selective")

#: Set on a checkpointed layer: its mode.
MODE_ATTR = "plsh_activation_checkpointing"

_aten = torch.ops.aten
#: Ops whose outputs selective checkpointing keeps (with every ``plsh_dist::`` op: the attention's
#: forward ops and the seed). Linear layers reach the dispatcher as ``mm`` (``addmm`` with a bias).
_SAVED_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}


def _layers(model: nn.Module):
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder `layers`; expected a transformers decoder LM")
    return layers


def apply_activation_checkpointing(model: nn.Module, mode: str = "full") -> nn.Module:
    """Checkpoint every decoder layer of ``model`` in ``mode`` (``"full"`` or ``"selective"``), in place
    (module doc). Call it before DeepSpeed wraps the model, before or after :func:`compile_layers`.
    Applying it again changes the mode. Returns the model."""
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing mode {mode!r} is invalid; choose one of {list(AC_MODES)}")
    for layer in _layers(model):
        if getattr(layer, "gradient_checkpointing", False):
            raise ValueError("this model has transformers' gradient checkpointing enabled: disable it "
                             "(model.gradient_checkpointing_disable()) before apply_activation_checkpointing")
        layer.forward = functools.partial(_checkpointed_forward, layer, mode)
        setattr(layer, MODE_ATTR, mode)
        allow_recompute_side_effects(layer)
    return model


def checkpointing_mode(layer: nn.Module) -> str | None:
    """The mode ``layer`` is checkpointed in, or None."""
    return getattr(layer, MODE_ATTR, None)


def allow_recompute_side_effects(layer: nn.Module) -> None:
    """If ``layer`` is both checkpointed and compiled (``layer.compile``), run its compiled calls with
    dynamo's ``skip_fwd_side_effects_in_bwd_under_checkpoint`` on (module doc); else nothing.
    Idempotent; ``compile_layers`` and :func:`apply_activation_checkpointing` both call it."""
    compiled = getattr(layer, "_compiled_call_impl", None)
    if compiled is None or checkpointing_mode(layer) is None:
        return
    if isinstance(compiled, functools.partial) and compiled.func is _with_recompute_side_effects:
        return
    layer._compiled_call_impl = functools.partial(_with_recompute_side_effects, compiled)


def _with_recompute_side_effects(compiled, *args, **kwargs):
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        return compiled(*args, **kwargs)


def _keep_all(func) -> bool:
    """Selective: the matmuls and every ``plsh_dist::`` op (the attention's forward, the seed)."""
    return func in _SAVED_OPS or getattr(func, "namespace", None) == "plsh_dist"


def _keep_seed(func) -> bool:
    """Full, compiled: the seed only (its recompute would read the step tensor at backward time)."""
    return func is torch.ops.plsh_dist.layer_seed.default


def _policy(keep, ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if keep(func) else CheckpointPolicy.PREFER_RECOMPUTE


_SELECTIVE = functools.partial(create_selective_checkpoint_contexts, functools.partial(_policy, _keep_all))
_SEED_ONLY = functools.partial(create_selective_checkpoint_contexts, functools.partial(_policy, _keep_seed))


def _runtime(layer: nn.Module):
    binding = getattr(getattr(layer, "self_attn", None), "plsh_binding", None)
    return None if binding is None else binding.runtime


def _at_step(runtime, step: int, micro_step: int, forward, *args):
    """``forward(*args)`` at the seed context's (``step``, ``micro_step``): the recompute in a backward
    run at another step draws the forward's masks."""
    if (runtime.step, runtime.micro_step) == (step, micro_step):
        return forward(*args)
    with runtime.replaying(step, micro_step):
        return forward(*args)


def _checkpointed_forward(layer: nn.Module, mode: str, *args, **kwargs):
    """The layer's forward under ``checkpoint``; as is without gradients or with a KV cache (decoding:
    a recompute would write the cache twice)."""
    forward = functools.partial(type(layer).forward, layer, **kwargs)
    if not torch.is_grad_enabled() or kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
        return forward(*args)
    if torch.compiler.is_compiling():
        # the seed is an op's output here: keep it, in both modes (module doc)
        context_fn = _SELECTIVE if mode == "selective" else _SEED_ONLY
    else:
        context_fn = _SELECTIVE if mode == "selective" else None
        runtime = _runtime(layer)
        if runtime is not None:
            forward = functools.partial(_at_step, runtime, runtime.step, runtime.micro_step, forward)
    if context_fn is None:
        return checkpoint(forward, *args, use_reentrant=False)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn)
