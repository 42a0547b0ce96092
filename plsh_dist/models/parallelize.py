"""Apply sequence parallelism to a built model, once (torchtitan's ``parallelize_*``), and
compile its decoder layers (torchtitan's ``apply_compile``).

The model side applies parallelism, so :mod:`plsh_dist.distributed` never
imports the models: this module sets the SP group on every attention module's
binding, and each bias then runs its sequence-parallel form
(:mod:`plsh_dist.distributed.sp`). The trainer and evaluation call :func:`apply_sequence_parallel` once
after building or loading the model; no process group travels through the
model's forward.
"""

from __future__ import annotations

from torch import nn

from plsh_dist.models.activation_checkpoint import allow_recompute_side_effects
from plsh_dist.models.build import set_attention_group


def apply_sequence_parallel(model: nn.Module, group) -> nn.Module:
    """Make every attention module of ``model`` attend over the SP ``group``.

    Each rank then feeds its contiguous chunk with its chunk's global
    ``position_ids``. ``group=None`` (no sequence parallelism) makes it one
    process's attention again. Returns the model.
    """
    return set_attention_group(model, group)


def compile_layers(model: nn.Module, backend: str = "inductor") -> nn.Module:
    """Compile every decoder layer of ``model`` on its own, in place (``layer.compile(backend=,
    fullgraph=True)``), as torchtitan does: parameter names, ``state_dict`` and checkpoints are
    unchanged, and the layers share one compiled code (same shapes). The attention is one custom op
    per layer (:mod:`plsh_dist.ops.custom_ops`; under sequence parallelism
    :mod:`plsh_dist.distributed.sp.custom_ops`, its collectives inside), so each layer is one graph
    (``fullgraph``: a graph break is an error, not a silent slowdown). Call it after sequence parallelism
    is applied (or not) and before DeepSpeed wraps the model. Returns the model."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    for layer in decoder.layers:
        layer.compile(backend=backend, fullgraph=True)
        # activation checkpointing (before or after this) runs inside the compiled layer: activation_checkpoint.py
        allow_recompute_side_effects(layer)
    return model
