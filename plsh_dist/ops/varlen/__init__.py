"""The CUDA varlen strategy: one variable-length flash call per sample (flash-attn or PyTorch's aten
flash kernels), with its call plan (``calls.py``), its kernels' choice (``kernels.py``) and a CPU
reference standing in for them in tests (``reference.py``)."""

from plsh_dist.ops.varlen.kernels import VarlenKernel, cuda_half, flash_attn_available
from plsh_dist.ops.varlen.strategy import VarlenPerSample

__all__ = ["VarlenKernel", "cuda_half", "flash_attn_available", "VarlenPerSample"]
