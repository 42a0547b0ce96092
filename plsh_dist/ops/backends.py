"""The one backend vocabulary: what a user asks for, and what then runs.

``Backend`` is the user's choice (``backend=`` of the ops, ``[attention].backend``
of a run config); :func:`resolve_backend` turns it, for the tensors at hand,
into an :class:`Impl`: a *layout* (how the blocks are laid out for the
kernel) and a :class:`Kernel` (what computes them).

    backend       CPU (or CUDA fp32 / fp64)        CUDA fp16 / bf16
    "auto"        padded + auto (aten or math)     varlen + flash_attn if installed, else varlen + aten
    "torch"       padded + auto                    varlen + aten
    "math"        padded + math                    padded + math
    "flash_attn"  error                            varlen + flash_attn (error if not installed)

Layouts: ``padded`` pads every block of one (sample, head) to the longest and
runs one batched dense call (:mod:`.padded_blocks`); ``varlen`` makes every
block one sequence of a varlen call over all heads and batch rows
(:mod:`.plsh_varlen`). Nothing here touches CUDA at import time.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass

import torch

__all__ = [
    "Backend", "BACKENDS", "Method", "METHODS", "Kernel", "Impl", "VARLEN_REFERENCE", "resolve_backend",
    "resolve_method", "flash_attn_available", "flash_attn_module",
]


class Backend(str, enum.Enum):
    """What the user asks for."""

    AUTO = "auto"
    """flash-attn varlen when installed and the tensors suit it, else ``torch``."""
    TORCH = "torch"
    """PyTorch's own kernels: padded blocks on the CPU, aten varlen flash on CUDA fp16/bf16."""
    MATH = "math"
    """Explicit matmuls on padded blocks: any device and dtype."""
    FLASH_ATTN = "flash_attn"
    """The flash-attn package's varlen kernels (CUDA fp16/bf16 only)."""


#: The values ``backend=`` accepts, in documentation order.
BACKENDS = tuple(b.value for b in Backend)


class Method(str, enum.Enum):
    """How PLSH computes its estimator (both give the same numbers up to rounding)."""

    AUTO = "auto"
    """The faster of the two for the device and sizes (:func:`resolve_method`)."""
    ONEPASS = "onepass"
    """One attention with integer weights ``c_ij`` (bias ``log c_ij``): cost grows like log s."""
    PER_SAMPLE = "per_sample"
    """s block attentions merged by log-sum-exp: cost grows like s."""


#: The values ``method=`` accepts.
METHODS = tuple(m.value for m in Method)


class Kernel(str, enum.Enum):
    """What computes one dense (padded) or varlen attention call."""

    AUTO = "auto"
    """Padded layout: aten's flash-attention-for-CPU, or ``math`` for blocks of
    at most :data:`plsh_dist.ops.dense.MATH_MAX_LEN` keys (chosen per call)."""
    MATH = "math"
    """Explicit matmuls (any device/dtype; memory O(queries x keys) per call)."""
    ATEN = "aten"
    """PyTorch's flash kernels: ``_scaled_dot_product_flash_attention_for_cpu``
    (padded, CPU) or ``_flash_attention_forward/_backward`` (varlen, CUDA)."""
    FLASH_ATTN = "flash_attn"
    """flash-attn's ``_flash_attn_varlen_forward/_backward``."""
    REFERENCE = "reference"
    """The varlen layout on padded explicit matmuls, any device: lets the CPU
    tests run everything around the CUDA kernels."""


@dataclass(frozen=True)
class Impl:
    """A resolved backend: block layout and kernel, and whether PLSH runs in one pass."""

    varlen: bool
    kernel: Kernel
    onepass: bool = False
    """One attention with the bias ``log c_ij`` (:mod:`plsh_dist.ops.plsh_onepass`)
    instead of s block attentions merged by log-sum-exp; set by :func:`resolve_method`."""


@functools.lru_cache(maxsize=1)
def flash_attn_module():
    """flash-attn's ``flash_attn_interface`` module, or None when it cannot be imported."""
    try:
        from flash_attn import flash_attn_interface  # noqa: PLC0415 (optional GPU extra)
    except Exception:  # ImportError, or a CUDA build mismatch raising at import
        return None
    return flash_attn_interface


def flash_attn_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when flash-attn is installed and supports tensors of this device/dtype."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and flash_attn_module() is not None


def resolve_backend(backend: str | Backend, device: torch.device, dtype: torch.dtype) -> Impl:
    """Map the user's ``backend`` to the implementation for tensors of ``device``/``dtype``."""
    try:
        backend = Backend(backend)
    except ValueError:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}") from None
    if backend is Backend.MATH:
        return Impl(varlen=False, kernel=Kernel.MATH)
    if backend is Backend.FLASH_ATTN:
        if not flash_attn_available(device, dtype):
            raise ValueError(
                "backend='flash_attn' needs CUDA tensors in fp16/bf16 and the flash-attn package "
                "(pip install 'plsh_dist[gpu]'); use backend='auto' to fall back to torch"
            )
        return Impl(varlen=True, kernel=Kernel.FLASH_ATTN)
    if backend is Backend.AUTO and flash_attn_available(device, dtype):
        return Impl(varlen=True, kernel=Kernel.FLASH_ATTN)
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return Impl(varlen=True, kernel=Kernel.ATEN)
    return Impl(varlen=False, kernel=Kernel.AUTO)


#: Runs the varlen path on explicit matmuls (CPU tests of the CUDA code path).
VARLEN_REFERENCE = Impl(varlen=True, kernel=Kernel.REFERENCE)


def resolve_method(method: str | Method, impl: Impl, num_samples: int) -> Impl:
    """``impl`` with ``onepass`` set for the user's PLSH ``method``.

    ``auto``: one pass on the padded (CPU) path from s = 2 on, where the
    attention benchmark measures it faster (README, "Attention operator");
    per sample with s = 1 (the two are the same attention) and on the CUDA
    varlen path, whose one-pass kernel is not written yet (an explicit
    ``method="onepass"`` there runs the device-generic one-pass on explicit
    matmuls).
    """
    try:
        method = Method(method)
    except ValueError:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}") from None
    if method is Method.AUTO:
        onepass = num_samples >= 2 and not impl.varlen
    else:
        onepass = method is Method.ONEPASS
    return dataclasses.replace(impl, onepass=onepass)
