"""What a bias's attention costs, for the planner (:mod:`plsh_dist.plan`): one cost object per bias.

``Bias.cost(num_heads, strategy)`` resolves a run's attention for the kernel the op would choose
(an :class:`AttentionSetup`) and hands it to the bias's :class:`BiasCost` subclass, which lives in the
bias's own file and answers every cost question alike, as methods of that one object: query-key
pairs, CUDA workspace, the hash its kernel tiles, its sequence-parallel halo.

Legend: T tokens of one causal sequence, Hq query heads, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionSetup:
    """What the run's attention computes, resolved for the device."""

    bias: str
    sigma: tuple[float, ...]
    """Per query head (a constant sigma repeated)."""
    per_head_hash: bool
    """One hash per head (sigma unset) or one shared by all heads."""
    num_samples: int
    """Hash samples a call computes (1 for the exact biases and fixed blocks)."""
    onepass: bool
    varlen: bool
    """CUDA's varlen kernels (one varlen call per sample over all heads)."""
    window: int
    """Key window of ``"window"``; of ``"truncated"``, the widest head's."""
    chunk_size: int | None
    head_windows: tuple[int, ...] | None = None
    """Per query head, the keys it reads (``Bias.key_window``); None: every earlier key."""
    fused: bool = False
    """PLSH / fixed blocks on the fused Triton kernel (CUDA with Triton): its cost is the
    tiles it visits (:mod:`plsh_dist.plan.kernel_tiles`), not the pairs of the band."""
    sampler: str = "iid"


@dataclass(frozen=True)
class CallShape:
    """One attention call as the planner counts it."""

    batch: int
    tokens: int
    """This rank's queries."""
    keys: int
    """The keys its attention reads: ``tokens``, plus the halo or the gathered sequence under SP."""
    q_heads: int
    kv_heads: int
    head_dim: int
    itemsize: int
    """Bytes of one element of q, k, v (2 for bf16)."""

    @property
    def u(self) -> int:
        """Elements of one q-sized tensor: batch x tokens x Hq x D."""
        return self.batch * self.tokens * self.q_heads * self.head_dim


class BiasCost(abc.ABC):
    """The cost of one bias's attention under one :class:`AttentionSetup`: a subclass per bias (its
    ``cost_model``) implements the abstract methods and overrides what differs. ``bias`` is the
    :class:`~plsh_dist.biases.base.Bias` it was made by (which imports this module: not imported here)."""

    def __init__(self, bias, setup: AttentionSetup) -> None:
        self.bias = bias
        self.setup = setup

    @abc.abstractmethod
    def pairs_per_head(self, T: int) -> list[float]:
        """Query-key pairs each query head computes for one causal sequence of ``T`` tokens."""

    @abc.abstractmethod
    def workspace_cuda(self, shape: CallShape) -> tuple[int, int, str]:
        """Transient bytes ``(forward, backward, how counted)`` of one call on CUDA, on the path this
        bias takes there (the fused kernel's are the planner's own)."""

    def kernel_hash(self, seed: int):
        """The hash of ``seed`` a hashed bias's kernel tiles and halo follow; None for the others."""
        return None

    def sp_needs(self, chunks, shape: CallShape, seed: int):
        """What a rank of ``chunks`` (the SP group's
        :class:`~plsh_dist.distributed.group_chunks.GroupChunks`) receives under sequence parallelism at
        the hash of ``seed``: the halo needs (:mod:`plsh_dist.distributed.halo`), or None for an
        all-gather of every chunk."""
        return None
