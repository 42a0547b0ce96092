"""A KV cache that keeps only the keys a windowed attention mode reads.

Under ``"window"`` and ``"truncated"`` a query never reads a key ``w`` or more
positions back (``w`` the widest head's window), so a decoder needs to keep
only the last ``w - 1`` tokens' keys and values per layer: transformers'
sliding-window cache layer does exactly that, and returns the kept keys
followed by the new ones, the layout :func:`plsh_dist.models.attention.plsh_dist_attention`
decodes against (the last K positions before the queries). Decoding with it
gives the logits of one full forward (``tests/models/test_kv_cache.py``).
"""

from __future__ import annotations

from torch import nn
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from plsh_dist.models.attention import BINDING_ATTR
from plsh_dist.models.build import attention_modules
from plsh_dist.ops.alibi import widest_window


def window_cache(model: nn.Module) -> Cache:
    """A cache of ``w_layer - 1`` tokens per layer for ``model``'s windowed attention mode.

    ValueError when a layer's mode has no window (``"alibi"``, ``"plsh"``...: every key
    may be read; use ``DynamicCache``)."""
    num_heads = model.config.num_attention_heads
    layers = []
    for i, module in enumerate(attention_modules(model)):
        binding = getattr(module, BINDING_ATTR, None)
        window = None if binding is None else widest_window(binding.bias.key_window(num_heads))
        if window is None:
            bias = None if binding is None else binding.cfg.bias
            raise ValueError(f"layer {i}: attention bias {bias!r} has no key window, so a "
                             "window cache would drop keys it reads; use transformers.DynamicCache, or a "
                             "'window' / 'truncated' mode")
        layers.append(DynamicSlidingWindowLayer(sliding_window=window))
    return Cache(layers=layers)
