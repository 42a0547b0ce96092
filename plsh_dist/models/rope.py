"""Rope on/off for transformers decoders without touching their code.

Qwen3, Llama and Mistral compute ``(cos, sin) = model.rotary_emb(x, position_ids)``
once per forward and every attention layer applies
``q * cos + rotate_half(q) * sin`` (same for k). Rope off = make that module
return ``cos = 1, sin = 0``: the rotation is then the identity *exactly*
(``q * 1 + r * 0 == q`` in every float format), for all three families,
with no patching of module-level functions and no change to the module
tree, parameter names or checkpoints. It is a forward hook on the rotary
module that replaces its output; the flag can be flipped at any time.

Cost of rope off: two (B, T, head_dim) tensors and the elementwise rotation
of q/k per layer, negligible next to attention.
"""

from __future__ import annotations

import torch
from torch import nn

_FLAG = "plsh_rope_enabled"
_HANDLE = "plsh_rope_hook"


def rotary_module(model: nn.Module) -> nn.Module:
    """The decoder's shared rotary embedding (``<decoder>.rotary_emb``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    rotary = getattr(decoder, "rotary_emb", None)
    if rotary is None:
        raise ValueError(
            f"{type(model).__name__} has no shared `rotary_emb` module; rope on/off supports decoders that "
            "compute (cos, sin) once per forward (Qwen3, Llama, Mistral)"
        )
    return rotary


def _identity_rotation(module: nn.Module, args, kwargs, output):
    """Forward hook: with rope off, replace (cos, sin) by (1, 0) of the same shape and dtype."""
    if getattr(module, _FLAG, True):
        return output
    cos, sin = output
    return torch.ones_like(cos), torch.zeros_like(sin)


def set_rope(model: nn.Module, enabled: bool) -> None:
    """Turn the rotation of q and k on or off (idempotent, reversible)."""
    rotary = rotary_module(model)
    if getattr(rotary, _HANDLE, None) is None:
        setattr(rotary, _HANDLE, rotary.register_forward_hook(_identity_rotation, with_kwargs=True))
    setattr(rotary, _FLAG, bool(enabled))


def rope_enabled(model: nn.Module) -> bool:
    """Whether q and k are rotated."""
    return bool(getattr(rotary_module(model), _FLAG, True))
