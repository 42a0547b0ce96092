"""Shared or per-head hashing: the one rule, and the query heads each hash head serves.

A hash has one head (one ``sigma`` for every query head: each sample's blocks
serve all heads at once) or one head per query head (per-head ``sigma``,
ALiBi's default: query head ``h`` has its own blocks and reads key/value head
``h // g``, ``g = Hq // Hkv``). Every strategy reads the decision from
:func:`head_groups` instead of testing ``lsh.num_heads`` itself.

Legend: B batch, n tokens, Hq / Hkv query / key-value heads, Hc query heads
of one group (Hq shared, 1 per-head), D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.gqa import repeat_kv
from plsh_dist.ops.input_checks import LAYOUT


@dataclass(frozen=True)
class HeadGroup:
    """The query heads that one hash head serves.

    Attributes:
        hash_head: the hash's head (0 for a shared hash).
        q_heads: slice of the query heads it serves (all of them, or one).
        kv_head: the key/value head those query heads read, or None for a shared
            hash (every key/value head, repeated to the query heads).
    """

    hash_head: int
    q_heads: slice
    kv_head: int | None


@dataclass(frozen=True)
class HeadGroups:
    """How a call's query heads split over its hash heads.

    Attributes:
        shared: one hash serves every head (``lsh.num_heads == 1``).
        groups: one :class:`HeadGroup` per hash head, in head order.
        kv_repeat: g = Hq // Hkv, the query heads per key/value head.
    """

    shared: bool
    groups: tuple[HeadGroup, ...]
    kv_repeat: int


def head_groups(lsh: PositionalLSH, num_q_heads: int, num_kv_heads: int) -> HeadGroups:
    """The hash heads of ``lsh`` over Hq query heads and Hkv key/value heads (ValueError names
    ``sigma`` when the hash has neither 1 nor Hq heads)."""
    if lsh.num_heads not in (1, num_q_heads):
        raise ValueError(f"sigma must be a float or a Tensor[Hq] with Hq={num_q_heads} entries, got "
                         f"{lsh.num_heads} entries. {LAYOUT}")
    g = num_q_heads // num_kv_heads
    if lsh.num_heads == 1:
        return HeadGroups(True, (HeadGroup(0, slice(0, num_q_heads), None),), g)
    return HeadGroups(False, tuple(HeadGroup(h, slice(h, h + 1), h // g) for h in range(num_q_heads)), g)


def group_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: HeadGroup):
    """q (B, n, Hq, D), k, v (B, n, Hkv, D) of one group as contiguous (B, n, Hc, D) each: all
    heads (k, v repeated to the query heads) or one query head and its key/value head
    (copied once per head: gathers from strided views are slow)."""
    if group.kv_head is None:
        g = q.shape[2] // k.shape[2]
        return q.contiguous(), repeat_kv(k, g).contiguous(), repeat_kv(v, g).contiguous()
    kv = slice(group.kv_head, group.kv_head + 1)
    return q[:, :, group.q_heads].contiguous(), k[:, :, kv].contiguous(), v[:, :, kv].contiguous()
