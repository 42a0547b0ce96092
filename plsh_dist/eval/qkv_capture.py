"""Queries, keys and values of a Hugging Face decoder's layers, by forward hooks.

The approximation-error tools need the q/k/v a trained model really produces
(``T*`` and ``T~`` differ most where attention is peaked).  Hooks on each
layer's ``q_proj`` / ``k_proj`` / ``v_proj`` catch the projections; the
per-head RMSNorm of Qwen3-style models (``q_norm`` / ``k_norm``) is applied
here exactly as the module applies it.  The rotary embedding is *not*
applied: positional LSH replaces the positional term with the ALiBi bias it
approximates, so the position-free q/k are the inputs it would see (for an
ALiBi checkpoint they are exactly the attention's inputs).

Legend: B batch, T tokens, H heads (query or key/value), D head dim.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["capture_qkv"]


def capture_qkv(
    model: torch.nn.Module, input_ids: torch.Tensor, layers: Sequence[int] | None = None
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Run ``model(input_ids)`` once and return ``(q, k, v)`` per requested layer.

    Args:
        model: a decoder with ``model.model.layers[i].self_attn`` holding
            ``q_proj``, ``k_proj``, ``v_proj`` and ``head_dim`` (Llama, Qwen2/3,
            Mistral...); optional ``q_norm`` / ``k_norm`` are applied.
        input_ids: LongTensor (B, T).
        layers: layer indices (default: all), in the order returned.
    Returns:
        ``[(q (B, T, Hq, D), k (B, T, Hkv, D), v (B, T, Hkv, D)), ...]``, detached,
        in the model's dtype.
    """
    try:
        blocks = model.model.layers
    except AttributeError as err:
        raise ValueError(f"{type(model).__name__} has no model.layers; capture_qkv expects a "
                         "Hugging Face decoder (e.g. Qwen3ForCausalLM)") from err
    layers = list(range(len(blocks))) if layers is None else [int(i) for i in layers]
    bad = [i for i in layers if not 0 <= i < len(blocks)]
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has {len(blocks)} layers")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")

    caught: dict[tuple[int, str], torch.Tensor] = {}
    handles = []

    def hook(layer: int, name: str):
        def fn(_module, _inputs, output):
            caught[(layer, name)] = output.detach()
        return fn

    try:
        for i in layers:
            attn = blocks[i].self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                handles.append(getattr(attn, name).register_forward_hook(hook(i, name)))
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        for handle in handles:
            handle.remove()

    out = []
    with torch.no_grad():
        for i in layers:
            attn = blocks[i].self_attn
            B, T = input_ids.shape
            q, k, v = (caught[(i, n)].view(B, T, -1, attn.head_dim) for n in ("q_proj", "k_proj", "v_proj"))
            # Same order as the module: per-head norm on (B, T, H, D), before rotary.
            if getattr(attn, "q_norm", None) is not None:
                q = attn.q_norm(q)
            if getattr(attn, "k_norm", None) is not None:
                k = attn.k_norm(k)
            out.append((q, k, v))
    return out
