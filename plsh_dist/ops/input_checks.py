"""Input checks shared by the public attention functions: clear ValueErrors
that name the argument and the fix, raised before any work starts."""

from __future__ import annotations

import torch

#: What a length mismatch most often means, said where a shape allows the check.
LAYOUT = ("q, k, v are (batch, seqlen, heads, head_dim); a (batch, heads, seqlen, head_dim) tensor puts its heads "
          "where seqlen belongs: pass q.transpose(1, 2) (and k, v)")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q (B, T, Hq, D); k, v (B, T, Hkv, D) with Hq % Hkv == 0."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, seqlen, heads, head_dim), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, seqlen and head_dim"
        )
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(
            f"number of query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]}) "
            "for grouped-query attention"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def check_positions(positions: torch.Tensor | None, seqlen: int, device: torch.device) -> torch.Tensor:
    """None -> arange(seqlen); else a strictly increasing LongTensor[seqlen] (returned on CPU).

    Increasing positions make every hash bucket a contiguous run of tokens
    and let the causal mask follow token order.
    """
    if positions is None:
        return torch.arange(seqlen, dtype=torch.int64)
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError("positions must be an integer LongTensor[seqlen] of absolute token positions")
    if positions.shape[-1] != seqlen:  # the one check of the layout positions allow
        raise ValueError(f"positions has {positions.shape[-1]} positions but q.shape[1] (seqlen) is {seqlen}: "
                         f"{LAYOUT}; or pass LongTensor[seqlen]")
    if positions.dim() == 2:
        if not bool((positions == positions[:1]).all()):
            raise ValueError("positions (batch, seqlen) must be equal for every batch row; pass a LongTensor[seqlen] "
                             "(packed rows with their own document layouts: cu_seqlens)")
        positions = positions[0]
    if positions.dim() != 1 or positions.numel() != seqlen:
        raise ValueError(
            f"positions must be LongTensor[seqlen] with seqlen={seqlen}, got shape {tuple(positions.shape)}"
        )
    positions = positions.to("cpu", torch.int64)
    if seqlen > 1 and not bool((positions[1:] > positions[:-1]).all()):
        raise ValueError("positions must be strictly increasing (a contiguous or gapped range of absolute positions)")
    if seqlen and int(positions[0]) < 0:
        raise ValueError(f"positions must be >= 0, got first position {int(positions[0])}")
    return positions


def softmax_scale_for(q: torch.Tensor, softmax_scale: float | None) -> float:
    """Default 1/sqrt(head_dim), as flash-attn and SDPA."""
    if softmax_scale is None:
        return q.shape[-1] ** -0.5
    if not softmax_scale > 0:
        raise ValueError(f"softmax_scale must be > 0, got {softmax_scale}")
    return float(softmax_scale)
