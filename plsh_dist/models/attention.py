"""Our attention as a registered transformers attention implementation.

transformers' decoders (Qwen3, Llama, Mistral, ...) look their attention up
by name: ``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation)``
and call it as ``fn(module, query, key, value, attention_mask, dropout=,
scaling=, sliding_window=, position_ids=, ...)`` with HF's (B, H, T, D)
layout, after rope. We register ``"plsh_dist"`` there and dispatch on the
attention mode stored on each attention module (``set_attention_mode``).

Masks: the op masks causally itself (and per block), so no (T, T) mask may
be built. ``create_causal_mask`` asks ``ALL_MASK_ATTENTION_FUNCTIONS`` for
the implementation's mask builder; ours returns ``None`` after checking that
a given 2-D padding mask pads nothing (padding is not supported: pack
sequences instead).

Positions: the decoder layers forward ``position_ids`` (B, T_local) to the
attention function. Under sequence parallelism they are the *global*
positions of this rank's chunk; all rows must be equal (one packed layout
per batch). Row 0 becomes the op's ``positions``.

Which ops compute: each attention module may carry an attention-ops object
(``plsh_attention_ops``): anything with the four functions of
:mod:`plsh_dist.ops` (``plsh_attention``, ``fixed_blocks_attention``,
``alibi_attention``, ``causal_attention``) and their keyword arguments. None
(the default) means the single-process ops; sequence parallelism binds its
own once (:func:`plsh_dist.distributed.sp.apply_sequence_parallel`). The
model code never sees a process group.

Legend: B batch, T tokens (this rank's), Hq query heads, Hkv key/value
heads, D head dim.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from plsh_dist import ops as local_ops
from plsh_dist.hashing import alibi_slopes
from plsh_dist.models.config import AttentionConfig
from plsh_dist.models.runtime import AttentionRuntime

__all__ = ["IMPLEMENTATION", "register", "plsh_dist_attention", "no_dense_mask", "head_scales"]

#: Name under which transformers finds our attention (``config._attn_implementation``).
IMPLEMENTATION = "plsh_dist"

#: Attributes set on each HF attention module by ``set_attention_mode``.
CFG_ATTR = "plsh_attn_cfg"
RUNTIME_ATTR = "plsh_runtime"
OPS_ATTR = "plsh_attention_ops"


@functools.lru_cache(maxsize=64)
def head_scales(sigma: float | None, num_heads: int):
    """Per-head ``(sigma, slopes)`` of a config's ``sigma`` (cached; do not modify).

    ``sigma is None``: ALiBi's slopes ``m_h`` and ``sigma_h = 1 / m_h``
    (Tensor[Hq] each). A float: ``sigma`` itself (one hash shared by all heads)
    and slopes ``1 / sigma`` on every head. Both stay on the CPU, float32:
    the ops build hashes and bias tables from CPU values, so a device copy
    would only add a sync.
    """
    if sigma is None:
        slopes = alibi_slopes(num_heads)
        sig = slopes.reciprocal()
    else:
        slopes = torch.full((num_heads,), 1.0 / sigma, dtype=torch.float32)
        sig = float(sigma)
    return sig, slopes


def _positions(position_ids: torch.Tensor | None, T: int, runtime: AttentionRuntime) -> torch.Tensor:
    """position_ids (B or 1, T) -> CPU LongTensor[T] shared by the batch.

    Every layer of a forward receives the same ``position_ids`` tensor; the
    runtime keeps its CPU copy, so the device-to-host copy (a sync on GPU)
    and the equal-rows check happen once per forward, not once per layer.
    The ops read positions on the CPU (they build the hash blocks there).
    """
    if position_ids is None:
        return torch.arange(T)
    cached = runtime.positions_cache
    # Identity and version: a tensor refilled in place (a reused buffer) misses the cache.
    if cached is not None and cached[0] is position_ids and cached[1] == position_ids._version:
        return cached[2]
    if position_ids.dim() != 2 or position_ids.shape[-1] != T:
        raise ValueError(f"position_ids must be (B, T={T}), got shape {tuple(position_ids.shape)}")
    rows = position_ids.to("cpu", torch.long)
    if rows.shape[0] > 1 and not bool((rows == rows[:1]).all()):
        raise ValueError(
            "position_ids differ between batch rows; plsh_dist attention shares one set of positions "
            "(and one hash) across the batch: pack every row with the same layout"
        )
    # Holding the tensor itself keeps the identity test sound (its id cannot be reused).
    runtime.positions_cache = (position_ids, position_ids._version, rows[0])
    return rows[0]


def _dispatch(
    cfg: AttentionConfig,
    runtime: AttentionRuntime,
    ops,
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    scale: float | None,
) -> torch.Tensor:
    """q (B, T, Hq, D), k/v (B, T, Hkv, D) -> (B, T, Hq, D) under ``cfg.bias``, computed by ``ops``."""
    common = dict(positions=positions, causal=True, softmax_scale=scale)
    if cfg.bias == "none":
        return ops.causal_attention(q, k, v, **common)
    if cfg.bias in ("alibi", "window"):
        _, slopes = head_scales(cfg.sigma, q.shape[2])
        window = cfg.window if cfg.bias == "window" else None
        return ops.alibi_attention(q, k, v, slopes=slopes, window=window, chunk_size=cfg.chunk_size, **common)
    sigma, _ = head_scales(cfg.sigma, q.shape[2])
    if cfg.bias == "plsh":
        seed = runtime.layer_seed(layer, cfg.fixed_masks)
        return ops.plsh_attention(
            q, k, v, sigma=sigma, num_samples=cfg.num_samples, seed=seed,
            backend=cfg.backend, sampler=cfg.sampler, method=cfg.method, **common,
        )
    if cfg.bias == "fixed_blocks":
        return ops.fixed_blocks_attention(q, k, v, sigma=sigma, backend=cfg.backend, method=cfg.method, **common)
    raise ValueError(f"unknown attention bias {cfg.bias!r}")  # unreachable: AttentionConfig checks it


def plsh_dist_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function.

    Args:
        module: the HF attention module; carries ``plsh_attn_cfg``,
            ``plsh_runtime``, ``layer_idx`` and optionally ``plsh_attention_ops``.
        query: (B, Hq, T, D); key, value: (B, Hkv, T, D) (after rope, if on).
        attention_mask: must be None (our mask builder returns None).
        scaling: softmax scale (``head_dim ** -0.5`` in these models).
        position_ids: (B, T) global positions, equal rows.
    Returns:
        ``(out, None)`` with out (B, T, Hq, D) in query's dtype (HF's layout
        before ``o_proj``); no attention probabilities exist to return.
    """
    cfg: AttentionConfig | None = getattr(module, CFG_ATTR, None)
    runtime: AttentionRuntime | None = getattr(module, RUNTIME_ATTR, None)
    if cfg is None or runtime is None:
        raise RuntimeError(
            f"attention implementation {IMPLEMENTATION!r} needs an attention mode on every attention module: "
            "build the model with plsh_dist.models.build_model or call set_attention_mode(model, attn_cfg)"
        )
    if attention_mask is not None:
        raise ValueError(
            "plsh_dist attention got a materialised attention mask; it masks causally itself and supports "
            "no custom/padding masks (pass attention_mask=None and pack sequences)"
        )
    if dropout:
        raise ValueError(f"attention dropout is not supported (got {dropout}); set attention_dropout=0")
    if sliding_window is not None:
        raise ValueError(
            f"the HF config asks for sliding_window={sliding_window}; use AttentionConfig(bias='window', "
            "window=...) and build the HF config with sliding_window=None"
        )
    B, Hq, T, D = query.shape
    if key.shape[2] != T:
        raise ValueError(
            f"keys ({key.shape[2]}) and queries ({T}) differ in length: a KV cache is in use, which plsh_dist "
            "attention does not support (use_cache=False)"
        )
    layer = module.layer_idx
    positions = _positions(position_ids, T, runtime)
    q = query.transpose(1, 2)  # (B, T, Hq, D)
    k = key.transpose(1, 2)  # (B, T, Hkv, D)
    v = value.transpose(1, 2)  # (B, T, Hkv, D)
    ops = getattr(module, OPS_ATTR, None) or local_ops
    out = _dispatch(cfg, runtime, ops, layer, q, k, v, positions, scaling)
    return out, None


def no_dense_mask(*, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """Mask builder of our implementation: builds nothing.

    ``attention_mask`` is the optional 2-D (B, T) padding mask the caller
    passed; all-ones (what tokenizers return for unpadded rows) is accepted,
    anything that pads is refused.
    """
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError(
            "padding masks are not supported by plsh_dist attention: pack sequences to full length "
            "(mask loss with labels=-100 instead)"
        )
    return None


def register() -> None:
    """Register the attention function and its mask builder with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, plsh_dist_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, no_dense_mask)


register()
