"""Our attention as a registered transformers attention implementation.

transformers' decoders (Qwen3, Llama, Mistral, ...) look their attention up by name and call it with
HF's (B, H, T, D) layout after rope; we register ``"plsh_dist"`` there and compute what the module's
:class:`AttentionBinding` says (``set_attention_mode`` binds one to every attention module): its
attention settings, its bias object (:mod:`plsh_dist.biases`, which computes the forward and the
decoding), seed context and seed rule, and its sequence-parallel group. No (T, T) mask is built
(:func:`padding_mask`).
How masks, padded batches, positions and packed documents, sequence parallelism, the KV cache and the
compiled path are handled: docs/design.md, section 4, "The model's attention hook".

Legend: B batch, T tokens (this rank's), Hq query heads, Hkv key/value
heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from plsh_dist.biases import AttentionCall, Bias, bias_for
from plsh_dist.models.config import AttentionConfig
from plsh_dist.models.runtime import AttentionRuntime
from plsh_dist.ops.layout import layout_of_position_ids

#: Name under which transformers finds our attention (``config._attn_implementation``).
IMPLEMENTATION = "plsh_dist"

#: The attribute ``set_attention_mode`` sets on each HF attention module: its :class:`AttentionBinding`.
BINDING_ATTR = "plsh_binding"


class PositionsCache:
    """The ops' ``(positions, cu_seqlens)`` of the current forward, shared by a model's layers.

    Every layer of a forward receives the same position tensors; keeping the result
    makes the layout's device-to-host copy (a sync on GPU) and checks happen once per
    forward, not once per layer. An entry lives for one forward: the model's decoder
    clears it when a forward starts (``models.build`` registers the hook), so a caller's
    buffer refilled in place for the next forward misses. Within a forward the held
    tensors are matched by identity (held, so their ids cannot be reused): no content
    comparison, no copy and no sync on a hit.
    """

    def __init__(self):
        self.inputs: tuple[torch.Tensor | None, ...] | None = None
        """The tensors the layout was made from: ``(position_ids, cu_seq_lens)``, or
        ``(attention_mask,)`` for a padded batch."""
        self.layout: Any = None
        """What was made from ``inputs``: the ops' ``(positions, cu_seqlens)``, or a :class:`Padding`."""

    def lookup(self, inputs: tuple[torch.Tensor | None, ...]) -> Any:
        """The layout of this forward's ``inputs`` (the same tensor objects), else None."""
        if self.inputs is None or len(inputs) != len(self.inputs):
            return None
        return self.layout if all(a is b for a, b in zip(inputs, self.inputs)) else None

    def store(self, inputs: tuple[torch.Tensor | None, ...], layout: Any) -> None:
        """Keep ``layout`` as the one of ``inputs`` until the forward ends."""
        self.inputs, self.layout = inputs, layout

    def clear(self, *_hook_args) -> None:
        """Forget the entry: a new forward starts (also a forward pre-hook, whose arguments it ignores)."""
        self.inputs = self.layout = None


@dataclass(frozen=True)
class AttentionBinding:
    """What one attention module computes with (``module.plsh_binding``).

    Attributes:
        cfg: the module's attention settings.
        runtime: the seed context, an :class:`~plsh_dist.models.runtime.AttentionRuntime` (shared by
            the model's modules); the seed rule is :meth:`seed`.
        layer: the module's layer index (``layer_idx``), an input of the seed rule.
        group: the sequence-parallel process group its rank's chunk attends over (None: one process;
            set by :func:`plsh_dist.models.parallelize.apply_sequence_parallel`).
        positions: the model's per-forward positions cache (shared by its modules; ``build_model``
            gives one, cleared at each forward); None: every call makes its layout.
        bias: ``cfg``'s bias object (:mod:`plsh_dist.biases`), which computes the attention.
    """

    cfg: AttentionConfig
    runtime: AttentionRuntime
    layer: int
    group: Any = None
    positions: PositionsCache | None = field(default=None, compare=False, repr=False)
    bias: Bias = field(init=False, compare=False, repr=False)
    layer_index: torch.Tensor = field(init=False, compare=False, repr=False)
    """``layer`` as an int64 scalar tensor: what a compiled layer reads, so the layers of a model share
    one compiled graph instead of one each (an int would be a constant of the graph)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bias", bias_for(self.cfg))
        object.__setattr__(self, "layer_index", torch.tensor(self.layer, dtype=torch.int64))

    def seed(self) -> int:
        """The hash seed of this layer in the seed context's current step (``fixed_masks``:
        step 0's): ``hash_seed(run_seed, step, micro_step, layer)``."""
        return self.runtime.layer_seed(self.layer, self.cfg.fixed_masks)

    def seed_tensor(self) -> torch.Tensor:
        """:meth:`seed` as an int64 scalar tensor computed by the op ``plsh_dist::layer_seed`` from the seed
        context's step tensor: a compiled graph reads the step as an input, so a new step is a new
        value, not a new graph."""
        return self.runtime.layer_seed_tensor(self.layer_index, self.cfg.fixed_masks)

    def forward(self, q, k, v, positions, scale, cu_seqlens=None) -> torch.Tensor:
        """q (B, T, Hq, D), k/v (B, T, Hkv, D) -> (B, T, Hq, D) under ``cfg.bias``, over ``group``."""
        call = AttentionCall(q, k, v, positions, cu_seqlens, scale, group=self.group)
        return self.bias.form(call)(call, self)

    def decode(self, q, k, v, q_pos, k_pos, scale) -> torch.Tensor:
        """A KV-cache step's rows: q (B, Tq, Hq, D) at ``q_pos`` against k/v (B, Tk, Hkv, D) at
        ``k_pos`` (:mod:`plsh_dist.ops.decode`) -> (B, Tq, Hq, D), the rows of one full forward."""
        return self.bias.decode(q, k, v, q_pos, k_pos, scale, self)


def _layout(position_ids: torch.Tensor | None, cu_seqlens: torch.Tensor | None, B: int, T: int,
            cache: PositionsCache | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """position_ids (B or 1, T) and the packed-documents offsets -> the ops' ``(positions, cu_seqlens)``.

    - ``cu_seqlens`` given (transformers' ``cu_seq_lens_q/k``): passed on; positions
      are row 0 when the rows agree, else the (B, T) rows.
    - position_ids that restart at 0 inside a row (``DataCollatorWithFlattening``):
      a document starts at every 0; positions are the (B, T) rows.
    - rows that differ without restarting: each row is one document.
    - otherwise: row 0 and no documents (the plain case, one hash for the batch).

    Every layer of a forward receives the same tensors; ``cache`` keeps the
    result, so the device-to-host copy (a sync on GPU) and the checks happen once
    per forward, not once per layer. The ops read positions on the CPU.
    """
    if position_ids is None and cu_seqlens is None:
        return torch.arange(T), None
    inputs = (position_ids, cu_seqlens)
    cached = cache.lookup(inputs) if cache is not None else None
    if cached is not None:
        return cached
    result = layout_of_position_ids(position_ids, cu_seqlens, B, T)
    if cache is not None:
        cache.store(inputs, result)
    return result


@dataclass(frozen=True)
class Padding:
    """A padding mask's layout, on the CPU: which tokens are real, and their positions.

    Attributes:
        real: BoolTensor (B, M), True for a real token (the mask, over every token the keys
            may hold: the cached ones then the new ones).
        positions: LongTensor (B, M), the number of real tokens before each token
            (``cumsum(mask) - 1`` clamped at 0, transformers' and BLOOM's rule): a row's real
            tokens sit at ``0 .. n - 1`` exactly as the row unpadded does.
    """

    real: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def of(cls, mask: torch.Tensor) -> "Padding":
        real = mask.to("cpu", torch.bool)
        return cls(real, (torch.cumsum(real.long(), 1) - 1).clamp(min=0))


def _padding(mask: torch.Tensor, cache: PositionsCache | None) -> Padding:
    """The :class:`Padding` of a (B, M) mask, made once per forward (every layer receives the
    same mask object; the device-to-host copy is a sync on GPU)."""
    if mask.dim() != 2:
        raise ValueError(
            f"plsh_dist attention got a materialised {mask.dim()}-D attention mask of shape {tuple(mask.shape)}; "
            "it masks causally itself and takes only a 2-D (batch, tokens) padding mask (or none)"
        )
    cached = cache.lookup((mask,)) if cache is not None else None
    if cached is None:
        cached = Padding.of(mask)
        if cache is not None:
            cache.store((mask,), cached)
    return cached


def _padded_forward(binding: AttentionBinding, q, k, v, pad: Padding, scale) -> torch.Tensor:
    """A padded full forward: q (B, T, Hq, D), k/v (B, T, Hkv, D) -> (B, T, Hq, D).

    Every row's real tokens go into one flat row (batch 1), each batch row one packed
    document at positions ``0 .. n_b - 1`` (no ``cu_seqlens`` when a single row has real
    tokens: the plain call of that row alone); the outputs go back to their tokens, and
    padded queries get zeros. Gather and scatter are differentiable."""
    B, T, Hq, D = q.shape
    if pad.real.shape != (B, T):
        raise ValueError(f"the padding mask has shape {tuple(pad.real.shape)} but the forward has (B, T) = "
                         f"({B}, {T}) tokens; pass a (batch, tokens) attention_mask")
    real = pad.real.flatten()
    index = torch.nonzero(real).flatten()  # (N,) the real tokens of the flattened (B, T) batch
    if index.numel() == 0:
        return torch.zeros_like(q)
    lengths = pad.real.sum(1)
    lengths = lengths[lengths > 0]
    cu_seqlens = None
    if lengths.numel() > 1:
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)]).to(torch.int32)
    on_device = index.to(q.device)

    def gather(x):  # (B, T, H, D) -> (1, N, H, D)
        return x.reshape(B * T, *x.shape[2:]).index_select(0, on_device)[None]

    out = binding.forward(gather(q), gather(k), gather(v), pad.positions.flatten()[index], scale, cu_seqlens)
    return q.new_zeros(B * T, Hq, D).index_copy(0, on_device, out[0]).reshape(B, T, Hq, D)


def _padded_decode(binding: AttentionBinding, q, k, v, pad: Padding, scale) -> torch.Tensor:
    """A padded KV-cache step: q (B, T, Hq, D) of the new tokens against k/v (B, K, Hkv, D).

    The mask covers the M tokens seen so far, the new ones last. ``M == K``: the keys are
    those tokens (``DynamicCache``); ``M > K``: the last K of them (a sliding-window cache);
    ``M < K``: a static cache, whose slots from M on are not written yet. Each row decodes
    its real keys at their real-token positions (:meth:`AttentionBinding.decode`); padded
    queries get zeros."""
    B, T = q.shape[:2]
    K, M = k.shape[1], pad.real.shape[1]
    if pad.real.shape[0] != B or M < T:
        raise ValueError(f"the padding mask has shape {tuple(pad.real.shape)} but the step has {B} rows of {T} "
                         "new tokens; pass the attention_mask of every token so far (cached and new)")
    if M < K:
        k, v = k[:, :M], v[:, :M]
    key_cols = slice(M - k.shape[1], M)
    out = torch.zeros_like(q)
    for b in range(B):
        real_k, real_q = pad.real[b, key_cols], pad.real[b, M - T:]
        if not bool(real_q.any()):
            continue
        ki = torch.nonzero(real_k).flatten().to(k.device)
        qi = torch.nonzero(real_q).flatten().to(q.device)
        rows = binding.decode(q[b:b + 1].index_select(1, qi), k[b:b + 1].index_select(1, ki),
                              v[b:b + 1].index_select(1, ki), pad.positions[b, M - T:][real_q],
                              pad.positions[b, key_cols][real_k], scale)
        out[b].index_copy_(0, qi, rows[0])
    return out


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
        module: the HF attention module; carries its :class:`AttentionBinding` (``plsh_binding``).
        query: (B, Hq, T, D); key, value: (B, Hkv, T, D) (after rope, if on),
            or (B, Hkv, K, D) with K > T when a KV cache is in use (the cached
            tokens then the new ones).
        attention_mask: None, or the (B, M) boolean padding mask our builder
            (:func:`padding_mask`) returns when a batch is padded: M = T in a full
            forward, the tokens seen so far with a KV cache. With it, positions come
            from the mask and ``position_ids`` are not read (module doc).
        scaling: softmax scale (``head_dim ** -0.5`` in these models).
        position_ids: (B, T) positions (under sequence parallelism the chunk's
            global positions, equal rows). Rows that restart at 0 are packed
            documents (transformers' ``DataCollatorWithFlattening``).
        kwargs: ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (equal: self-attention),
            packed documents as flash-attn's offsets over the flattened (B, T)
            batch (under sequence parallelism: over the whole sequence, the
            same on every rank); ``max_length_q/k`` are accepted and not needed.
    Returns:
        ``(out, None)`` with out (B, T, Hq, D) in query's dtype (HF's layout
        before ``o_proj``); no attention probabilities exist to return.
    """
    binding: AttentionBinding | None = getattr(module, BINDING_ATTR, None)
    if binding is None:
        raise RuntimeError(
            f"attention implementation {IMPLEMENTATION!r} needs an attention mode on every attention module: "
            "build the model with plsh_dist.models.build_model or call set_attention_mode(model, attn_cfg)"
        )
    if dropout:
        raise ValueError(f"attention dropout is not supported (got {dropout}); set attention_dropout=0")
    if sliding_window is not None:
        raise ValueError(
            f"the HF config asks for sliding_window={sliding_window}; use AttentionConfig(bias='window', "
            "window=...) and build the HF config with sliding_window=None"
        )
    if torch.is_autocast_enabled(query.device.type):
        # As SDPA under autocast (HF Trainer / TRL with bf16=True): q, k, v in the autocast dtype.
        # Qwen3's q/k norms return fp32 (an fp32 weight times a bf16 input) while v stays bf16.
        low = torch.get_autocast_dtype(query.device.type)
        query, key, value = query.to(low), key.to(low), value.to(low)
    B, Hq, T, D = query.shape
    q = query.transpose(1, 2)  # (B, T, Hq, D)
    k = key.transpose(1, 2)  # (B, T, Hkv, D); with a KV cache (B, K, Hkv, D), K > T
    v = value.transpose(1, 2)
    if attention_mask is not None:
        return _padded(binding, q, k, v, attention_mask, scaling, kwargs), None
    if torch.compiler.is_compiling() and key.shape[2] == T:
        # compiled: the layout (host integers read from the positions) is made inside the op
        call = AttentionCall(q, k, v, position_ids, _packed_offsets(kwargs), scaling, compiled=True,
                             group=binding.group)
        return binding.bias.form(call)(call, binding), None
    positions, cu_seqlens = _layout(position_ids, _packed_offsets(kwargs), B, T, binding.positions)
    if key.shape[2] != T:
        return _decode(binding, q, k, v, positions, scaling, cu_seqlens), None
    call = AttentionCall(q, k, v, positions, cu_seqlens, scaling, group=binding.group)
    return binding.bias.form(call)(call, binding), None


def _decode(binding: AttentionBinding, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
            scale: float | None, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """A KV-cache step: q (B, T, Hq, D) of the new tokens against k/v (B, K, Hkv, D), every
    cached token and the new ones (transformers' cache updated before the call).

    The cache holds consecutive tokens, the new ones last, so the keys sit at
    positions ``p_last - K + 1 .. p_last`` (``p_last`` the last query's position:
    0 .. K - 1 when generation starts at position 0; inferred from the queries'
    positions and the cache length, so position_ids must continue the cached
    tokens: what cannot be is refused, a cache filled under other positions
    cannot be seen). More keys than ``p_last + 1`` are a static cache's
    (``StaticCache``: slot ``j`` holds position ``j``, the slots after the
    queries not written yet, zeros: checked on the next and the last slot;
    such a cache must start at position 0): the first ``p_last + 1`` are used.
    The queries' rows are those of one full forward over those K tokens (:mod:`plsh_dist.ops.decode`): the
    same bias and the same hash seed rule (``binding.seed``), so the PLSH
    masks are those of the positions under this seed context, whichever
    ``cfg.method`` the full forward uses. Refused: packed documents and
    sequence parallelism (their layouts are not kept in a cache).
    """
    B, T, Hq, _ = q.shape
    K = k.shape[1]
    if binding.group is not None:
        raise ValueError(
            "a KV cache is in use (keys longer than queries) but this model's attention runs under sequence "
            "parallelism; decode on one process with the plain model (no apply_sequence_parallel), or pass "
            "use_cache=False"
        )
    if cu_seqlens is not None or positions.dim() != 1:
        raise ValueError(
            "a KV cache is in use but the inputs are packed documents (cu_seq_lens or position_ids restarting "
            "at 0 / differing between rows); decode one document per row with equal position rows, or pass "
            "use_cache=False"
        )
    last = int(positions[-1])
    # a static cache (StaticCache): slot j holds position j; the slots after the queries are unwritten (zeros)
    if K > last + 1 >= T and not bool(k[:, last + 1].any() or k[:, K - 1].any()):
        k, v, K = k[:, : last + 1], v[:, : last + 1], last + 1
    if K < T or last - int(positions[0]) != T - 1 or last < K - 1:
        raise ValueError(
            f"a KV cache is in use with {K} keys, but the {T} queries' position_ids {positions.tolist()[:8]}... "
            f"are not the last {T} of {K} consecutive positions starting at >= 0; pass position_ids that "
            "continue the cached tokens (or none: transformers then counts from the cache length)"
        )
    q_pos = positions.to(torch.long)
    k_pos = torch.arange(K) + (int(q_pos[-1]) - K + 1)
    return binding.decode(q, k, v, q_pos, k_pos, scale)


def _padded(binding: AttentionBinding, q, k, v, attention_mask: torch.Tensor, scale: float | None,
            kwargs: dict) -> torch.Tensor:
    """A padded batch (the mask builder passed a (B, M) mask that pads): the full forward or
    a KV-cache step over the real tokens (module doc); refuses what it cannot honour."""
    if binding.group is not None:
        raise ValueError(
            "padding masks are not supported under sequence parallelism: pack the rows to full length "
            "(labels=-100 on the filler), or run the padded batch on one process with the plain model"
        )
    if _packed_offsets(kwargs) is not None:
        raise ValueError(
            "got both a padding mask and packed documents (cu_seq_lens_q/k); pass one: packed rows need no "
            "attention_mask"
        )
    pad = _padding(attention_mask, binding.positions)
    if k.shape[1] == q.shape[1] and pad.real.shape[1] == q.shape[1]:
        return _padded_forward(binding, q, k, v, pad, scale)
    return _padded_decode(binding, q, k, v, pad, scale)


def _packed_offsets(kwargs: dict) -> torch.Tensor | None:
    """transformers' packed keyword arguments -> one offsets tensor (or None); refuses
    what the attention cannot honour instead of attending across documents."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and cu_k is None:
        return None
    if cu_q is cu_k:  # what the trainer passes (one tensor for both): nothing to compare (nor to sync)
        return cu_q
    if cu_q is None or cu_k is None or cu_q.shape != cu_k.shape or not bool(torch.equal(cu_q, cu_k)):
        raise ValueError(
            "cu_seq_lens_q and cu_seq_lens_k must both be given and equal (plsh_dist attention is "
            "self-attention over packed documents); pass the same offsets for both"
        )
    return cu_q


def padding_mask(*, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
    """Mask builder of our implementation: builds no (T, T) mask.

    ``attention_mask`` is the optional 2-D (B, M) padding mask the caller passed
    (transformers has made it boolean). None when there is none, or when it pads
    nothing (what tokenizers return for unpadded rows): the attention then runs its
    plain path. Otherwise that mask, which each layer receives as ``attention_mask``.
    """
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask


def register() -> None:
    """Register the attention function and its mask builder with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, plsh_dist_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, padding_mask)


register()
