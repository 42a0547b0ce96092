"""Test tolerances in one place, each with its reason.

fp64 paths compute the same sums as the dense fp64 reference in another
order: errors are a few ulps times the reduction length, so 1e-10 is tight
yet safe. fp32 paths accumulate in fp32 (flash-style online softmax, LSE
merges): relative error ~ sqrt(n) * 6e-8 for n ~ 1000 keys; 2e-5 absolute on
O(1) outputs and gradients leaves room for the backward's extra products.
"""

FP64 = dict(atol=1e-10, rtol=1e-10)
FP32 = dict(atol=2e-5, rtol=2e-5)
# bf16 (and fp16) ops may err at most 2x what a plain same-dtype PyTorch computation of
# the same estimator errs, both against its fp64 reference, for out and for each of dq,
# dk, dv (flash-attention's rule). No slack is added: flash-attn's tests add twice
# their fp32 reference's own rounding, and an fp64 reference's (~1e-16) is nothing
# next to bf16 errors (~1e-3); the rule holds without it in every mode
# (tests/ops/test_bf16_rule.py).
BF16_FACTOR = 2.0


def for_dtype(dtype):
    import torch

    return FP64 if dtype == torch.float64 else FP32
