"""Exact ALiBi: logits ``q_i . k_j * scale - m_h |p_i - p_j|`` over every earlier key.

Computed by ``plsh_dist::alibi_attention`` (the fused banded kernel on CUDA, query chunks
elsewhere); under sequence parallelism every rank all-gathers the keys and values. The windowed
and truncated biases are this one with a key window (``window.py``, ``truncated.py``).

Legend: B batch, T tokens, Hq query heads, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

import torch

from plsh_dist.biases.base import AttentionCall, Bias, LayerSeeds, head_scales
from plsh_dist.biases.cost import BiasCost, CallShape
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.ops import decode as decode_ops
from plsh_dist.ops.alibi import alibi_attention_op, default_chunk_size, window_list
from plsh_dist.ops.alibi_kernel import choose_alibi_kernel
from plsh_dist.ops.reference import alibi_weights


class AlibiCost(BiasCost):
    """Every earlier key (pairs), the chunked path (CUDA workspace), an all-gather under SP."""

    def pairs_per_head(self, T: int) -> list[float]:
        """Every key at or before the query: ``T (T + 1) / 2``."""
        return [T * (T + 1) / 2] * len(self.setup.sigma)

    def workspace_cuda(self, shape: CallShape) -> tuple[int, int, str]:
        """Query chunks of C against K keys (``ops/alibi.py``): k, v expanded to Hq heads, per chunk
        the bias (fp32 and its cast) and the explicit logits / probabilities (fp32) of every batch
        row; the backward adds fp32 dk, dv over the expanded keys and the chunk's gradient products."""
        batch, keys, q_heads, b = shape.batch, shape.keys, shape.q_heads, shape.itemsize
        u = shape.u
        k_exp = b * batch * keys * q_heads * shape.head_dim  # one of k, v expanded to Hq heads
        chunk = self.setup.chunk_size or default_chunk_size(q_heads, keys)
        e = q_heads * min(chunk, shape.tokens) * self.chunk_span(keys, chunk)  # bias elements of one chunk
        per_chunk_fwd = batch * e * (12 + b) + e * (4 + b) + 13 * e // q_heads
        per_chunk_bwd = batch * e * (16 + 2 * b) + e * (4 + b) + 13 * e // q_heads
        fwd = 2 * k_exp + per_chunk_fwd
        bwd = 2 * k_exp + b * u + 2 * (4 // b) * k_exp + per_chunk_bwd
        return int(fwd), int(bwd), "counted (chunked exact ALiBi)"

    def chunk_span(self, keys: int, chunk: int) -> int:
        """Keys one query chunk of ``chunk`` queries reads, of ``keys``."""
        return keys


class ExactAlibi(Bias):
    """Exact ALiBi (Press et al.): slope ``m_h`` per head (``sigma_h = 1 / m_h``), or ``1 / sigma``."""

    name = spec = "alibi"
    options = {"sigma": "sigma", "rope": "rope", "chunk": "chunk_size"}
    fields = ("sigma", "rope", "chunk_size")
    summary = "exact ALiBi"
    cost_model = AlibiCost

    @classmethod
    def check_fields(cls, cfg) -> None:
        if cfg.chunk_size is not None and cfg.chunk_size < 1:
            raise ValueError(f"attention.chunk_size must be an int >= 1 or left out, got {cfg.chunk_size!r}; "
                             f"e.g. chunk_size = 1024, or leave it out to let the op choose")

    def slopes(self, num_heads: int) -> torch.Tensor:
        """Tensor[Hq] float32 on the CPU, cached (do not modify)."""
        return head_scales(self.cfg.sigma, num_heads)[1]

    def chunk_size(self) -> int | None:
        return self.cfg.chunk_size

    def one_process(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """The op (compiled too: it lays the raw position_ids out itself when ``call.compiled``)."""
        q, k, v, H = call.q, call.k, call.v, call.num_heads
        window, chunk = self.key_window(H), self.chunk_size()
        return alibi_attention_op(q, k, v, call.positions, call.cu_seqlens, self.slopes(H), window_list(window), True,
                                  call.scale, chunk, choose_alibi_kernel(q.device, q.dtype, chunk), call.compiled)[0]

    def sequence_parallel(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        H = call.num_heads
        return sp_attention.alibi_attention(call.q, call.k, call.v, group=call.group, slopes=self.slopes(H),
                                            window=self.key_window(H), chunk_size=self.chunk_size(), **call.common())

    def decode(self, q, k, v, q_pos, k_pos, scale, seeds: LayerSeeds) -> torch.Tensor:
        H = q.shape[2]
        return decode_ops.alibi_decode(q, k, v, q_pos, k_pos, slopes=self.slopes(H), window=self.key_window(H),
                                       scale=scale)

    def reference_weights(self, positions, num_heads: int, seed: int) -> torch.Tensor | None:
        window = self.key_window(num_heads)
        return alibi_weights(self.slopes(num_heads), positions,
                             window=torch.tensor(window) if isinstance(window, tuple) else window)
