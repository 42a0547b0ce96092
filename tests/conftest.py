"""Session-wide setup that must happen before any test module is imported.

Triton's CPU interpreter (the Triton kernel's tests, ``tests/ops/triton_kernel``)
is chosen by ``TRITON_INTERPRET=1`` when ``triton`` is *imported* (it decorates
its own library then), and other packages may import triton early (deepspeed
does on first use). So it is set here, before collection, on machines without
CUDA; with CUDA the kernels compile and nothing is set.

The lab's samplers (``experiments/``) are registered for every test, as a run config
with ``[attention].sampler_module = "experiments.samplers"`` registers them: tests name
``stratified_ramp`` in configs and sweep every registered sampler (the setting itself:
``tests/test_sampler_module.py``, in fresh processes).
"""

import os
import sys


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not _cuda():
    os.environ["TRITON_INTERPRET"] = "1"

import experiments  # noqa: E402,F401  after the Triton setting: it imports torch, not triton
