"""PLSH in one pass on FlexAttention: inference on CPU (no gradient, no log-sum-exp).

The one-pass estimator (:mod:`plsh_dist.ops.cpu.onepass`) is attention with
the bias ``log c_ij`` over a band of keys per query. Here it is one compiled
FlexAttention call (:mod:`plsh_dist.ops.flex.attend`): the count as a ``score_mod``
reading every token's block bounds, the band as a block-sparse mask. On CPU
PyTorch compiles only its forward and returns no log-sum-exp, so this strategy
computes ``out`` alone: the table (:mod:`plsh_dist.ops.backends`) offers it
only to calls that need nothing else (no gradient, no ``return_lse``, one
process), and ``backend="auto"`` never picks it (why: the table's docstring).

Block bounds come from the hash's own arithmetic (the one pass's
``token_bounds``: documents and position offsets included), as int32
(s, Hh, n) tables: O(s n) memory per hash head, nothing of size n^2.

Legend: B batch, n tokens, Hq / Hkv query / key-value heads, D head dim,
s samples, Hh hash heads (1 shared, or Hq).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.flex.attend import band_block_mask, count_score_mod, flex_attend, flex_status
from plsh_dist.ops.cpu import onepass_forward, token_bounds
from plsh_dist.ops.strategy import Strategy

_log = logging.getLogger(__name__)

#: Shape sets compiled in this process (see :func:`_compiles`).
_COMPILED: set[tuple] = set()


def _path_flex(q, k, v, score_mod, block_mask, scale, enable_gqa):
    """FlexAttention through a function of this module's own, so that the graphs dynamo keeps
    for it (and counts against its recompile limit) are this strategy's alone: other users of
    FlexAttention in the process (benchmarks) do not take the strategy's room."""
    return torch.nn.attention.flex_attention.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                                             scale=scale, enable_gqa=enable_gqa)


@functools.cache
def _compiled_path_flex():
    return torch.compile(_path_flex, dynamic=False)  # static shapes: see plsh_dist.ops.flex.attend


def flex_cpu_inference(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the strategy runs: CPU fp32 tensors (what was measured), torch's compiled FlexAttention
    buildable here."""
    return device.type == "cpu" and dtype == torch.float32 and flex_status("cpu") is None


def block_bound_tables(lsh: PositionalLSH, positions: torch.Tensor, causal: bool, docs: Documents | None = None):
    """``(first, end)``: int32 (s, Hh, n) first token of the block holding each token in every
    sample and hash head, and one past its last (None when causal)."""
    tokens = torch.arange(positions.numel())
    bounds = [token_bounds(lsh, h, positions, tokens, causal, docs) for h in range(lsh.num_heads)]
    first = torch.stack([f for f, _ in bounds], dim=1).to(torch.int32)
    end = None if causal else torch.stack([e for _, e in bounds], dim=1).to(torch.int32)
    return first, end


def flex_forward(q, k, v, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool, scale: float,
                 docs: Documents | None = None) -> torch.Tensor:
    """One-pass PLSH output (B, n, Hq, D) in q's dtype on the compiled FlexAttention.

    q: (B, n, Hq, D); k, v: (B, n, Hkv, D); positions CPU LongTensor[n], increasing
    (within each document of ``docs``, a batch-1 call's documents).
    """
    first, end = block_bound_tables(lsh, positions, causal, docs)
    n = positions.numel()
    band_start = first.min(dim=0).values  # (Hh, n): keys sharing a block with the row in some sample
    band_end = (torch.arange(1, n + 1, dtype=torch.int32)[None].expand_as(band_start) if causal
                else end.max(dim=0).values)
    device = q.device
    mask = band_block_mask(band_start.to(device), band_end.contiguous().to(device))
    score_mod = count_score_mod(first.to(device), None if end is None else end.to(device))
    return flex_attend(q, k, v, score_mod, mask, scale, compiled=_compiled_path_flex())


def _compiles(key: tuple) -> bool:
    """Whether the call of shape set ``key`` runs compiled: one already compiled, or room for one
    more under dynamo's recompile limit. The CPU FlexAttention compiles static shapes only
    (dynamic ones fail to build in torch 2.13), so each (shapes, s, causal, scale) is one graph
    of :func:`_path_flex`; past the limit dynamo would run FlexAttention eagerly, on dense
    (T, T) scores."""
    import torch._dynamo  # noqa: PLC0415

    if key in _COMPILED:
        return True
    if len(_COMPILED) >= torch._dynamo.config.recompile_limit:
        return False
    _COMPILED.add(key)
    return True


@functools.lru_cache(maxsize=1)
def _say_once(message: str) -> None:
    _log.warning(message)


@dataclass(frozen=True)
class FlexOnePass(Strategy):
    """Strategy: one pass on FlexAttention, output only (``attend``; no ``forward`` / ``backward``:
    the table gives it only to calls that need neither gradients nor the log-sum-exp)."""

    onepass = output_only = True

    def attend(self, q, k, v, lsh, positions, *, causal, scale, docs=None) -> torch.Tensor:
        """``out`` (B, n, Hq, D), as the other strategies' forward computes it; past dynamo's recompile
        limit (new shape sets), the chunked one pass computes it, and the log says so once."""
        key = (tuple(q.shape), tuple(k.shape), q.dtype, lsh.num_samples, lsh.num_heads, causal, float(scale))
        if not _compiles(key):
            _say_once("PLSH on FlexAttention: dynamo's recompile limit is reached (one compile per shape "
                      "set); new shapes run on the chunked one pass")
            return onepass_forward(q, k, v, lsh, positions, causal=causal, scale=scale, docs=docs)[0]
        return flex_forward(q, k, v, lsh, positions, causal=causal, scale=scale, docs=docs)
