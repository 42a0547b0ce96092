"""Apply sequence parallelism to a built model, once (torchtitan's ``parallelize_*``), and
compile its decoder layers (torchtitan's ``apply_compile``).

The model side applies parallelism, so :mod:`plsh_dist.distributed` never
imports the models: every attention module calls whatever attention-ops object
is bound to it (the single-process :mod:`plsh_dist.ops` by default), and this
module binds :class:`~plsh_dist.distributed.sp.SequenceParallelAttention`
there. The trainer and evaluation call :func:`apply_sequence_parallel` once
after building or loading the model; no process group travels through the
model's forward.
"""

from __future__ import annotations

from torch import nn

from plsh_dist.distributed.sp.attention import SequenceParallelAttention
from plsh_dist.models.build import set_attention_ops


def apply_sequence_parallel(model: nn.Module, group) -> nn.Module:
    """Make every attention module of ``model`` attend over the SP ``group``.

    Each rank then feeds its contiguous chunk with its chunk's global
    ``position_ids``. ``group=None`` (no sequence parallelism) binds the
    single-process ops back. Returns the model.
    """
    return set_attention_ops(model, SequenceParallelAttention(group) if group is not None else None)


def compile_layers(model: nn.Module, backend: str = "inductor") -> nn.Module:
    """Compile every decoder layer of ``model`` on its own, in place (``layer.compile(backend=,
    fullgraph=True)``), as torchtitan does: parameter names, ``state_dict`` and checkpoints are
    unchanged, and the layers share one compiled code (same shapes). The attention is one custom op
    per layer (:mod:`plsh_dist.ops.custom_ops`), so each layer is one graph (``fullgraph``: a graph
    break is an error, not a silent slowdown). Call it after sequence parallelism is applied (or
    not) and before DeepSpeed wraps the model. Sequence-parallel ops are not custom ops yet: with
    them, compile is refused. Returns the model."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    for layer in decoder.layers:
        ops = getattr(getattr(layer.self_attn, "plsh_binding", None), "ops", None)
        if ops is not None:
            raise ValueError(f"[run].compile needs the single-process attention ops; this model's are "
                             f"{type(ops).__name__} (sequence parallelism): set [run].compile = \"off\"")
        layer.compile(backend=backend, fullgraph=True)
    return model
