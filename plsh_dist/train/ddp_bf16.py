"""ZeRO 0 with bf16: undo the optimizer step DeepSpeed takes before training starts.

Without ZeRO, DeepSpeed wraps the optimizer of bf16 weights in its
``FP16_UnfusedOptimizer`` (fp32 master weights, bf16 gradients). Its constructor
(``initialize_optimizer_states``) runs one ``optimizer.step()`` on zero gradients
to create AdamW's state. That step is not free: it counts (so every real step's
bias correction is one step late: the first update is 0.74x AdamW's) and applies
weight decay once to the fp32 masters. The ZeRO 1-3 optimizers take no such step.
``forget_initial_step`` returns the optimizer to the state a first ``step()``
expects: no AdamW state, masters equal to the model's bf16 weights.
"""

from __future__ import annotations

import torch


def forget_initial_step(optimizer) -> bool:
    """Undo ``FP16_UnfusedOptimizer``'s zero-gradient step (module doc) on the engine's optimizer;
    False (nothing done) for any other optimizer. Call right after ``deepspeed.initialize``."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    if not isinstance(optimizer, FP16_UnfusedOptimizer):
        return False
    inner: torch.optim.Optimizer = optimizer.optimizer
    inner.state.clear()  # AdamW creates its step count and moments again at the first real step
    with torch.no_grad():
        for masters, weights in zip(optimizer.fp32_groups, optimizer.fp16_groups):
            for master, weight in zip(masters, weights):
                master.copy_(weight)  # the masters were copied from these before the decayed step
    return True
