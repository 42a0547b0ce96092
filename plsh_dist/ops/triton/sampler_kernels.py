"""Triton kernels that samplers' device forms draw with (:mod:`plsh_dist.ops.triton.device_draws` launches them).

Imported only where Triton is importable. Each mirrors a numpy function of
:mod:`plsh_dist.hashing` operation for operation, so a sampler written with them and correctly
rounded torch ops draws on the device what its numpy form draws on the host:

- :func:`uniform_kernel`: :func:`~plsh_dist.hashing.counter_uniform` of a seed held in a device
  tensor, for index arrays and consecutive streams;
- :func:`log_kernel`: ``np.log``, element by element;
- :func:`gamma2_ppf_kernel`: :func:`~plsh_dist.hashing.gamma2_ppf`, its Newton steps and its stopping
  rule (every element has converged) over the whole array, in one program.

Under Triton's interpreter ``libdevice`` has no implementation; numpy's ``log1p`` and ``expm1`` stand
in (the functions the host calls), so the interpreter's draws equal the host's bit for bit. Compiled,
``exp``, ``log``, ``log1p`` and ``expm1`` are CUDA's (libdevice), which may differ from the CPU's in
their last bit, as ``hash_draw_kernel``'s ``log`` (docs/gpu.md).

Legend: n elements (flattened).
"""

from __future__ import annotations

import types

import triton
import triton.language as tl
from triton.language.extra import libdevice

from plsh_dist.ops.triton.table_kernels import _splitmix64
from plsh_dist.ops.triton.runtime import interpreting

#: gamma2_ppf's clip of the quantiles (its Newton steps need q in (0, 1))
_Q_LO = tl.constexpr(1e-300)
_Q_HI = tl.constexpr(1.0 - 1e-16)


def _numpy_libdevice():
    """``log1p`` and ``expm1`` for the interpreter: numpy's, on the interpreter's arrays."""
    import numpy as np  # noqa: PLC0415
    from triton.runtime.interpreter import TensorHandle  # noqa: PLC0415

    def wrap(fn):
        return lambda x, _semantic=None: tl.tensor(TensorHandle(fn(x.handle.data), x.handle.dtype.scalar), x.type)
    return types.SimpleNamespace(log1p=wrap(np.log1p), expm1=wrap(np.expm1))


if interpreting():
    libdevice = _numpy_libdevice()  # noqa: F811 (the kernels below read the module's global at run time)


@triton.jit
def uniform_kernel(Seed, T, H, Out, n, first_stream, NUM_STREAMS: tl.constexpr, BLOCK: tl.constexpr):
    """``Out[k, i] = counter_uniform(seed, T[i], H[i], first_stream + k)``, float64 [NUM_STREAMS, n], from
    the int64 scalar ``Seed`` and int64 index arrays ``T``, ``H`` [n]."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    t = tl.load(T + i, mask=inside, other=0).to(tl.uint64, bitcast=True)
    h = tl.load(H + i, mask=inside, other=0).to(tl.uint64, bitcast=True)
    key = _splitmix64(_splitmix64(_splitmix64(tl.load(Seed).to(tl.uint64, bitcast=True)) ^ t) ^ h)
    for k in tl.static_range(NUM_STREAMS):
        stream = (first_stream + k).to(tl.int64).to(tl.uint64, bitcast=True)
        bits = _splitmix64(key ^ stream)
        # 53 random bits -> (0, 1); the product by 2^-53 is exact, as the reference's division
        tl.store(Out + k * n + i, ((bits >> 11).to(tl.float64) + 0.5) * 1.1102230246251565e-16, mask=inside)


@triton.jit
def log_kernel(X, Y, n, BLOCK: tl.constexpr):
    """``Y = log(X)``, float64 [n]."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.log(tl.load(X + i, mask=i < n, other=1.0)), mask=i < n)


@triton.jit
def _gamma2_cdf(x):
    """``plsh_dist.hashing._gamma2_cdf``: the series below 1, the closed form above."""
    xs = tl.minimum(x, 1.0)
    term = xs * xs / 2.0
    series = xs * 0.0
    for k in tl.static_range(3, 23):
        series, term = series + term, term * xs / k
    return tl.where(x < 1.0, tl.exp(-xs) * series, -libdevice.expm1(-x) - x * tl.exp(-x))


@triton.jit
def _clipped(Q, i, n):
    """The quantiles at ``i`` clipped as the host clips them (the bounds made float64 from the Python
    floats: as a float32 constant the upper one would round to 1)."""
    lo = tl.full((), _Q_LO, tl.float64)
    hi = tl.full((), _Q_HI, tl.float64)
    return tl.minimum(tl.maximum(tl.load(Q + i, mask=i < n, other=0.5), lo), hi)


@triton.jit
def gamma2_ppf_kernel(Q, X, n, BLOCK: tl.constexpr):
    """``X = gamma2_ppf(Q)``, float64 [n], one program: a starting guess, then Newton steps over every
    element, BLOCK at a time, until all of them moved by at most ``1e-15 x`` in one step (at most 60).
    The stopping rule is the whole array's, as the host's, so each element takes the host's steps."""
    lanes = tl.arange(0, BLOCK)
    for c0 in range(0, n, BLOCK):
        i = c0 + lanes
        q = _clipped(Q, i, n)
        tail = -libdevice.log1p(-q) + libdevice.log1p(-libdevice.log1p(-q))
        # float64 sqrt is correctly rounded on every target (PTX has only sqrt.rn.f64)
        tl.store(X + i, tl.where(q < 0.5, tl.sqrt(2.0 * q), tail), mask=i < n)
    steps = 0
    going = 1
    while going != 0:
        moved = 0
        for c0 in range(0, n, BLOCK):
            i = c0 + lanes
            q = _clipped(Q, i, n)
            x = tl.load(X + i, mask=i < n, other=1.0)
            step = (_gamma2_cdf(x) - q) / tl.maximum(x * tl.exp(-x), 1e-300)
            x_new = tl.maximum(x - step, x * 0.5)
            tl.store(X + i, x_new, mask=i < n)  # each lane rewrites only its own elements
            still = (tl.abs(x_new - x) <= 1e-15 * x) == 0
            moved = tl.maximum(moved, tl.max((still & (i < n)).to(tl.int32), axis=0))
        steps += 1
        going = ((moved != 0) & (steps < 60)).to(tl.int32)
