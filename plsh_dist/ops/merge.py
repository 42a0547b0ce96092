"""Merging partial attentions by log-sum-exp (docs/design.md, section 1: "Log-sum-exp merge").

Positional LSH attention with ``s`` samples has numerator and denominator
summed over samples, so per-sample results ``(o_t, lse_t)`` combine exactly
as the partial attentions of ring attention do:

    lse = logsumexp_t(lse_t),   out = sum_t exp(lse_t - lse) * o_t

Averaging the normalised ``o_t`` instead would be a different (wrong)
estimator. We use the stable sigmoid / logsigmoid form of
ring-flash-attention, in fp32 (fp64 for fp64 inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for partial results: fp64 stays fp64, all else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_into(
    out_BTHD: torch.Tensor | None,
    lse_BHT: torch.Tensor | None,
    part_out_BTHD: torch.Tensor,
    part_lse_BHT: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge one partial attention into the running ``(out, lse)``.

    Args:
        out_BTHD: running output (B, T, H, D) in the accumulation dtype, or None.
        lse_BHT: running log-sum-exp (B, H, T), or None.
        part_out_BTHD, part_lse_BHT: the new part (any float dtype).
    Returns:
        The merged ``(out, lse)``; ``out`` is updated in place when given.
    """
    acc = accum_dtype(part_out_BTHD.dtype)
    if out_BTHD is None:
        return part_out_BTHD.to(acc, copy=True), part_lse_BHT.to(acc, copy=True)
    part_lse = part_lse_BHT.to(lse_BHT.dtype)
    # weight of the new part: exp(part_lse - lse_new) = sigmoid(part_lse - lse)
    weight_BTH1 = torch.sigmoid(part_lse - lse_BHT).transpose(1, 2).unsqueeze(-1)
    out_BTHD.sub_(weight_BTH1 * (out_BTHD - part_out_BTHD.to(out_BTHD.dtype)))
    lse_new = lse_BHT - F.logsigmoid(lse_BHT - part_lse)
    return out_BTHD, lse_new
