"""No positional bias: plain causal attention (positions reach it through rope only).

Eagerly PyTorch's SDPA; compiled, under sequence parallelism and decoding, exact ALiBi's
paths with zero slopes.
"""

from __future__ import annotations

import torch

from plsh_dist.biases.alibi import AlibiCost, ExactAlibi
from plsh_dist.biases.base import AttentionCall, LayerSeeds
from plsh_dist.biases.cost import CallShape
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.ops import decode as decode_ops
from plsh_dist.ops.alibi import causal_attention


class NoBiasCost(AlibiCost):
    """Every earlier key, on PyTorch's flash SDPA."""

    def workspace_cuda(self, shape: CallShape) -> tuple[int, int, str]:
        """PyTorch's flash SDPA: the backward's dq, dk, dv and the kernel's fp32 dq accumulator."""
        u, b = shape.u, shape.itemsize
        return 0, int(b * u * (1 + 2 * shape.kv_heads / shape.q_heads) + 4 * u), "counted (flash SDPA)"


class NoBias(ExactAlibi):
    """Plain causal attention: ALiBi with zero slopes."""

    name = spec = "none"
    options = {"rope": "rope"}
    fields = ("rope",)
    summary = "plain causal attention; positions only via rope"
    cost_model = NoBiasCost

    @classmethod
    def check_fields(cls, cfg) -> None:
        pass

    def slopes(self, num_heads: int) -> torch.Tensor:
        return torch.zeros(num_heads)

    def chunk_size(self) -> None:
        return None

    def one_process(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        return causal_attention(call.q, call.k, call.v, **call.common())

    def compiled(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """The ALiBi op with zero slopes (it lays packed documents out from the raw position_ids, which
        SDPA cannot)."""
        return super().one_process(call, seeds)

    def sequence_parallel(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        return sp_attention.causal_attention(call.q, call.k, call.v, group=call.group, **call.common())

    def decode(self, q, k, v, q_pos, k_pos, scale, seeds: LayerSeeds) -> torch.Tensor:
        return decode_ops.causal_decode(q, k, v, q_pos, k_pos, scale=scale)

    def reference_weights(self, positions, num_heads: int, seed: int) -> None:
        return None
