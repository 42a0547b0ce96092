"""Dense fp64 references for every attention strategy (tests and tools only: O(n^2)).

Legend: B batch, T tokens, Hq query heads, Hkv key/value heads, D head dim.

All strategies are one formula, ``T = D^-1 (E o W) V`` with ``E_ij = exp(q_i . k_j * scale)``
(``j <= i`` when causal) and a non-negative weight matrix ``W`` per head:

- exact ALiBi: ``W = L*``, ``L*_ij = exp(-m_h |p_i - p_j|)`` (times a window mask);
- positional LSH: ``W = M~``, the average of the sampled block masks;
- no bias: ``W = 1``.
"""

from __future__ import annotations

import torch

from plsh_dist.ops.gqa import repeat_kv


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    causal: bool = True,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Weighted softmax attention in fp64, returned in fp64.

    Args:
        q: (B, T, Hq, D); k, v: (B, T, Hkv, D), Hq % Hkv == 0.
        weights: (Hq, T, T) or (1, T, T) non-negative multiplicative weights
            (``W``), or None for plain attention.
    Returns:
        (B, T, Hq, D) float64.
    """
    B, T, Hq, D = q.shape
    groups = Hq // k.shape[2]
    scale = softmax_scale if softmax_scale is not None else D**-0.5
    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    k64, v64 = repeat_kv(k64, groups), repeat_kv(v64, groups)
    logits = torch.einsum("bihd,bjhd->bhij", q64, k64) * scale  # (B, Hq, T, T)
    w = torch.ones(1, T, T, dtype=torch.float64, device=q.device) if weights is None else weights.to(torch.float64)
    if causal:
        w = w * torch.ones(T, T, dtype=torch.float64, device=q.device).tril()
    # exp(S) * W, normalised; subtract the row max of S for stability (it cancels).
    logits = logits - logits.amax(dim=-1, keepdim=True)
    num = torch.exp(logits) * w[None]
    probs = num / num.sum(dim=-1, keepdim=True)
    return torch.einsum("bhij,bjhd->bihd", probs, v64)


def alibi_weights(
    slopes: torch.Tensor, positions: torch.Tensor, window: int | torch.Tensor | None = None
) -> torch.Tensor:
    """ALiBi's multiplicative weights ``exp(-m_h |p_i - p_j|)``, float64 (H, T, T).

    With ``window`` (an int for every head, or a LongTensor[H] with one per
    head), keys ``window_h`` or more positions before (or after) the query get
    weight 0 (sliding-window, or truncated, ALiBi).
    """
    p = positions.to(torch.float64)
    dist = (p[:, None] - p[None, :]).abs()
    w = torch.exp(-slopes.to(torch.float64)[:, None, None] * dist[None])
    if window is not None:
        window = torch.as_tensor(window, dtype=torch.float64).reshape(-1, 1, 1)  # (H or 1, 1, 1)
        w = w * (dist[None] < window).to(torch.float64)
    return w
