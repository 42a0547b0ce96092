"""Sequence-parallel traffic per layer, from the real hash, without computing attention.

PLSH and fixed blocks: for every layer the hash the run will draw (step 0,
micro-step 0: ``AttentionRuntime(run_seed).layer_seed(layer)``), every
rank's halo need (``plsh_needs``) over P equal chunks
(``GroupChunks`` built without a process group, as
tests/distributed/test_halo_exchange.py does) and its ``HaloExchange``: the keys and
values a rank receives in forward, the same bytes of their gradients sent
back in backward. Windowed ALiBi: the ``window - 1`` positions before each
chunk. Exact ALiBi and no bias all-gather K/V (P - 1 chunks received per
rank) and reduce-scatter dK/dV. Every forward draws fresh masks, so other
steps move about as much, not the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from plsh_dist.biases.cost import CallShape
from plsh_dist.distributed.halo import HaloExchange
from plsh_dist.distributed.group_chunks import GroupChunks
from plsh_dist.models.runtime import AttentionRuntime


@dataclass(frozen=True)
class LayerTraffic:
    """Bytes one layer moves per micro-step, for the worst rank and on average."""

    layer: int
    recv_tokens_max: int
    """(kv head, position) pairs the worst rank receives in forward (for one batch row)."""
    forward_bytes_max: int
    """K and V the worst rank receives in forward."""
    forward_bytes_mean: float
    backward_bytes_max: int
    """dK and dV the worst rank sends back to their owners."""
    halo_slots_max: int
    """Positions of the worst rank's halo buffers (both sides)."""


def _group_chunks(sp: int, tokens: int):
    firsts = tuple(r * tokens for r in range(sp))
    return [GroupChunks(None, r, sp, tuple(range(sp)), firsts, tokens) for r in range(sp)]


def sp_traffic(cost, attn_cfg, *, run_seed: int, layers: int, sp: int, tokens: int, batch: int, q_heads: int,
               kv_heads: int, head_dim: int, b: int) -> list[LayerTraffic]:
    """Per-layer traffic of one micro-step on ``sp`` ranks of ``tokens`` tokens each (module doc).

    ``cost``: the bias's :class:`~plsh_dist.biases.cost.BiasCost`; ``b``: bytes of the K/V dtype. Empty
    when ``sp == 1``.
    """
    if sp == 1:
        return []
    per_token = batch * head_dim * b * 2  # K and V of one (kv head, position), all batch rows
    tables = _group_chunks(sp, tokens)
    shape = CallShape(batch, tokens, tokens, q_heads, kv_heads, head_dim, b)
    out = []
    for layer in range(layers):
        seed = AttentionRuntime(run_seed=run_seed).layer_seed(layer, attn_cfg.fixed_masks)
        needs = cost.sp_needs(tables[0], shape, seed)
        if needs is None:  # all-gather of every other chunk, every kv head
            recv = [(sp - 1) * tokens * kv_heads] * sp
            slots = [(sp - 1) * tokens] * sp
        else:
            plans = [HaloExchange.build(chunks, needs) for chunks in tables]
            recv = [p.recv_tokens() for p in plans]
            slots = [p.left_pos.numel() + p.right_pos.numel() for p in plans]
        worst = max(recv)
        out.append(LayerTraffic(layer=layer, recv_tokens_max=worst, forward_bytes_max=worst * per_token,
                                forward_bytes_mean=sum(recv) / sp * per_token, backward_bytes_max=worst * per_token,
                                halo_slots_max=max(slots)))
        if not cost.bias.seeded:  # the same every layer
            out.extend(LayerTraffic(layer=i, **{k: v for k, v in vars(out[-1]).items() if k != "layer"})
                       for i in range(1, layers))
            break
    return out
