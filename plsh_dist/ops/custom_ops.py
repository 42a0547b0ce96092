"""What the attention ops share as ``torch.library`` custom ops, so a compiled model keeps one graph.

``torch.compile`` cannot trace the ops' insides: the hash draws in uint64 numpy,
block layouts and query chunks are host integers read from position tensors
(``.item()``, ``.tolist()``, data-dependent shapes). As flash-attn does for its
kernels, each entry point is one opaque op of the graph with a fake (meta)
implementation giving its outputs' shapes and dtypes, and an autograd formula
calling the op's backward, itself an op:

    op                                   returns                    backward op                           defined in
    plsh_dist::block_attention           out (B, T, Hq, D), lse     plsh_dist::block_attention_backward   ops/plsh.py
    plsh_dist::alibi_attention           out (B, T, Hq, D), lse     plsh_dist::alibi_attention_backward   ops/alibi.py
    plsh_dist::layer_seed                a layer's hash seed        (none: integers)                      here

Each op lives in its algorithm's file, with its public function; this module holds
what they share (the namespace, the fake outputs, the autograd formula) and imports none of
them; the ops lay raw ``position_ids`` out with :mod:`plsh_dist.ops.layout`.

``out`` is contiguous in q's dtype, ``lse`` (B, Hq, T) contiguous fp32 (fp64 for fp64
inputs) and not differentiable; the gradients are contiguous in their input's dtype.

What the graph carries and the op rebuilds (the hash, the strategy, the layouts), and what the
autograd formula saves: docs/design.md, section 4, "Custom ops in the middle".

Legend: B batch, T tokens, Hq query heads, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from plsh_dist.ops.merge import accum_dtype
from plsh_dist.splitmix import MASK64, hash_seed, splitmix64_int

NAMESPACE = "plsh_dist"


def fake_forward(q: Tensor) -> tuple[Tensor, Tensor]:
    B, T, Hq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        q.new_empty((B, Hq, T), dtype=accum_dtype(q.dtype))


def fake_backward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def register_autograd(op, backward_op) -> None:
    """``op(q, k, v, *params) -> (out, lse)``'s autograd: saves q, k, v, out, lse (the only activations
    saved) and keeps the params (small host tensors among them: positions, offsets, seed, sigma or
    slopes); backward is ``backward_op(dout, q, k, v, out, lse, *params) -> (dq, dk, dv)``."""

    def setup_context(ctx, inputs, output):
        q, k, v, *params = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.params = params

    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward_op(dout.contiguous(), q, k, v, out, lse, *ctx.params)
        return (dq, dk, dv) + (None,) * len(ctx.params)

    op.register_autograd(backward, setup_context=setup_context)


# --- seeds ------------------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::layer_seed", mutates_args=())
def layer_seed(steps: Tensor, run_seed: int, layer: Tensor) -> Tensor:
    """``hash_seed(run_seed, step, micro_step, layer)`` as an int64 scalar tensor on ``steps``' device, from
    ``steps`` = LongTensor[2] ``(step, micro_step)`` and ``layer`` (an int64 scalar on the CPU; tensors, so a
    compiled graph serves every step and layer; ``run_seed`` taken mod 2^64, as ``hash_seed`` does).

    ``steps`` on the CPU: computed on the host. On a GPU: one launch reads the step there, nothing is read
    back, so a captured CUDA graph draws the masks of whatever step ``steps`` holds when it replays."""
    if steps.device.type == "cpu":
        step, micro_step = steps.tolist()
        return torch.tensor(hash_seed(run_seed & MASK64, step, micro_step, int(layer)), dtype=torch.int64)
    from plsh_dist.ops.triton import runtime  # noqa: PLC0415 (the wing's launcher; Triton when asked)

    out = steps.new_empty((), dtype=torch.int64)
    run_key = signed64(splitmix64_int(run_seed & MASK64))
    runtime.launcher("table_kernels", steps.device).layer_seed_kernel[(1,)](steps, out, run_key, int(layer))
    return out


@layer_seed.register_fake
def _(steps, run_seed, layer):
    return steps.new_empty((), dtype=torch.int64)


def signed64(x: int) -> int:
    """An int taken mod 2^64 as a signed int64 (what an op's ``int`` argument holds)."""
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x
