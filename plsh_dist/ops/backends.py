"""The one table: how PLSH is computed, for a user's ``backend`` / ``method`` and the tensors at hand.

:func:`choose_strategy` maps (backend, method, device, dtype, s) to one *strategy*, a small
frozen object holding the forward and backward of one way to compute the estimator
(``TritonOnePass``, ``PaddedPerSample``, ``VarlenPerSample``, ``OnePass``, ``DecodeOnePass``,
``FlexOnePass``). It is the only place that chooses, once per call; what a caller needs to know
of the answer is an attribute of the strategy (:class:`~plsh_dist.ops.strategy.Strategy`), so
nothing downstream tests the backend, the method, the device or the strategy's type again. An op
takes the answer by name (:func:`strategy_name`, :func:`strategy_named`), so its backward looks
the strategy up instead of choosing again. ``TABLE`` holds the rows in priority order,
:func:`describe_table` prints it and :func:`add_backend` adds a backend's rows. Exact ALiBi's
one choice, the fused kernel or query chunks, is :func:`~plsh_dist.ops.alibi_kernel.choose_alibi_kernel`
(below ``alibi.py``, which the decoding strategy imports; the same rule: chosen once per call, the answer
passed on).

docs/design.md, section 4 ("One table" and "The strategy table"), shows the table, what each
backend gives, the strategy interface and how to add a strategy.
Nothing here touches CUDA at import time.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from plsh_dist.ops.decode import DecodeOnePass
from plsh_dist.ops.dense import DenseKernel
from plsh_dist.ops.flex import FlexOnePass, flex_cpu_inference
from plsh_dist.ops.cpu import OnePass, PaddedPerSample
from plsh_dist.ops.varlen import VarlenKernel, VarlenPerSample, cuda_half, flash_attn_available
from plsh_dist.ops.triton import TritonOnePass, triton_cuda, triton_interpreter


class Backend(str, enum.Enum):
    """What the user asks for."""

    AUTO = "auto"
    """The first row of :data:`TABLE` that applies, in table order, among the rows that
    ``backend="auto"`` may pick (:func:`auto_order` names their backends)."""
    TORCH = "torch"
    """PyTorch's own kernels: padded blocks on the CPU, aten varlen flash on CUDA fp16/bf16."""
    MATH = "math"
    """Explicit matmuls on padded blocks: any device and dtype."""
    FLASH_ATTN = "flash_attn"
    """The flash-attn package's varlen kernels (CUDA fp16/bf16 only)."""
    TRITON = "triton"
    """The fused one-pass Triton kernel (CUDA, compute capability >= 8.0; CPU tensors under
    Triton's interpreter)."""
    FLEX = "flex"
    """The one pass on PyTorch's compiled FlexAttention: CPU fp32, output only (no gradient,
    no log-sum-exp)."""


#: The values ``backend=`` accepts, in documentation order.
BACKENDS = tuple(b.value for b in Backend)


class Method(str, enum.Enum):
    """How PLSH computes its estimator (both give the same numbers up to rounding)."""

    AUTO = "auto"
    """The faster of the two for the device and sizes (the table's "method=auto" column)."""
    ONEPASS = "onepass"
    """One attention with integer weights ``c_ij`` (bias ``log c_ij``): cost grows like log s."""
    PER_SAMPLE = "per_sample"
    """s block attentions merged by log-sum-exp: cost grows like s."""


#: The values ``method=`` accepts.
METHODS = tuple(m.value for m in Method)


def _anywhere(device: torch.device, dtype: torch.dtype) -> bool:
    return True


# A row's ``auto`` rule; its docstring is the rule's cell in :func:`describe_table`.
def _always(num_samples: int) -> bool:
    """always"""
    return True


def _never(num_samples: int) -> bool:
    """never"""
    return False


def _two_or_more(num_samples: int) -> bool:
    """s >= 2"""
    return num_samples >= 2


@dataclass(frozen=True)
class Row:
    """One row of the table.

    Attributes:
        backend: the backend that offers this strategy (a name of :func:`add_backend`'s for a
            backend added at run time).
        method: what the strategy computes (``ONEPASS`` or ``PER_SAMPLE``).
        applies: ``(device, dtype) -> bool``, where the strategy runs.
        runs_on: ``applies`` in words (the table's "runs on" column).
        strategy: the strategy object.
        auto: ``num_samples -> bool``, whether ``method="auto"`` picks this row.
        needs: what ``applies`` asks for, said when an explicit ``backend=`` finds none of
            its rows applying (empty for rows that apply anywhere).
        in_auto: whether ``backend="auto"`` may pick this row.
    """

    backend: Backend | str
    method: Method
    applies: Callable[[torch.device, torch.dtype], bool]
    runs_on: str
    strategy: object
    auto: Callable[[int], bool] = _always
    needs: str = ""
    in_auto: bool = True

    @property
    def out_only(self) -> bool:
        """The strategy computes the output only: chosen only for a call that needs neither gradients
        nor the log-sum-exp (``choose_strategy(out_only=True)``)."""
        return self.strategy.output_only


_FLASH_ATTN_NEEDS = "CUDA tensors in fp16/bf16 and the flash-attn package (pip install 'plsh_dist[gpu]')"
_TRITON_NEEDS = ("the triton package (pip install 'triton>=3.6') and CUDA tensors of compute capability >= 8.0 "
                 "in fp16/bf16/fp32, or CPU tensors in fp32/fp16 with TRITON_INTERPRET=1 set before triton is "
                 "imported")
_FLEX_NEEDS = ("CPU fp32 tensors, a torch whose compiled FlexAttention builds here (x86 with AVX2 and a C++ "
               "compiler), and a call that needs neither gradients nor the log-sum-exp (under torch.no_grad(), "
               "return_lse=False, one process)")

#: The strategies, in priority order for ``backend="auto"`` (see the module docstring).
_CUDA_HALF = "CUDA fp16/bf16"
_FLASH_ATTN_RUNS_ON = "CUDA fp16/bf16, flash-attn"
_ANYWHERE = "anything"

TABLE: tuple[Row, ...] = (
    Row(Backend.TRITON, Method.ONEPASS, triton_cuda, "CUDA (sm >= 80) fp16/bf16/fp32", TritonOnePass(),
        needs=_TRITON_NEEDS),
    Row(Backend.TRITON, Method.ONEPASS, triton_interpreter, "CPU fp32/fp16, Triton interpreter", TritonOnePass(),
        needs=_TRITON_NEEDS, in_auto=False),
    Row(Backend.FLEX, Method.ONEPASS, flex_cpu_inference, "CPU fp32, output only", FlexOnePass(), needs=_FLEX_NEEDS,
        in_auto=False),
    Row(Backend.FLASH_ATTN, Method.PER_SAMPLE, flash_attn_available, _FLASH_ATTN_RUNS_ON,
        VarlenPerSample(VarlenKernel.FLASH_ATTN), needs=_FLASH_ATTN_NEEDS),
    Row(Backend.FLASH_ATTN, Method.ONEPASS, flash_attn_available, _FLASH_ATTN_RUNS_ON, OnePass(DenseKernel.AUTO),
        auto=_never, needs=_FLASH_ATTN_NEEDS),
    Row(Backend.TORCH, Method.PER_SAMPLE, cuda_half, _CUDA_HALF, VarlenPerSample(VarlenKernel.ATEN)),
    Row(Backend.TORCH, Method.ONEPASS, cuda_half, _CUDA_HALF, OnePass(DenseKernel.AUTO), auto=_never),
    Row(Backend.TORCH, Method.ONEPASS, _anywhere, _ANYWHERE, OnePass(DenseKernel.AUTO), auto=_two_or_more),
    Row(Backend.TORCH, Method.PER_SAMPLE, _anywhere, _ANYWHERE, PaddedPerSample(DenseKernel.AUTO)),
    Row(Backend.MATH, Method.ONEPASS, _anywhere, _ANYWHERE, OnePass(DenseKernel.MATH), auto=_two_or_more,
        in_auto=False),
    Row(Backend.MATH, Method.PER_SAMPLE, _anywhere, _ANYWHERE, PaddedPerSample(DenseKernel.MATH), in_auto=False),
)

#: The forward-only strategy of a decoding step, for every backend and method (the same
#: estimator as either method's full forward).
DECODE = DecodeOnePass()

#: The varlen strategy on explicit matmuls (CPU tests of the CUDA code path; in no row).
VARLEN_REFERENCE = VarlenPerSample(VarlenKernel.REFERENCE)


def strategy_name(strategy) -> str:
    """``VarlenPerSample(FLASH_ATTN)``: the strategy's class and its kernel, as the table shows them and
    as an op takes the chosen strategy (:func:`strategy_named` reads it back)."""
    values = (getattr(strategy, field.name) for field in dataclasses.fields(strategy))
    return f"{type(strategy).__name__}({', '.join(v.name if isinstance(v, enum.Enum) else repr(v) for v in values)})"


def strategy_named(name: str):
    """The strategy :func:`strategy_name` calls ``name``: a row's, or the varlen reference's (tests).
    A lookup, not a choice: an op's forward and backward both read the one strategy their caller chose.
    The names are made once per table (:func:`add_backend` makes a new one), not at every op call."""
    global _NAMED
    if _NAMED[0] is not TABLE:
        named: dict = {}
        for strategy in (*(row.strategy for row in TABLE), VARLEN_REFERENCE):
            named.setdefault(strategy_name(strategy), strategy)  # the first row's, as the table reads
        _NAMED = (TABLE, named)
    try:
        return _NAMED[1][name]
    except KeyError:
        raise ValueError(f"no strategy of the table is called {name!r}") from None


#: ``(table, name -> strategy)`` of :func:`strategy_named`, for the table it was made from.
_NAMED: tuple[tuple, dict] = ((), {})


@torch.compiler.assume_constant_result
def chosen_name(backend: str, method: str, device: torch.device, dtype: torch.dtype, num_samples: int) -> str:
    """:func:`choose_strategy`'s answer for a call that needs gradients or the log-sum-exp, by name (what
    the ops take). A compiled call runs it once, while dynamo traces it: its answer is a constant of the
    graph."""
    return strategy_name(choose_strategy(backend, method, device, dtype, num_samples))

def describe_table() -> str:
    """``TABLE`` as the text of the module docstring's table (and docs/design.md's): one
    line per row, then the decoding strategy; 4 spaces of indent, no trailing newline."""
    widths = (12, 12, 36, 29, 13)  # every column but the last
    lines = [("backend", "method", "runs on", "strategy", "method=auto", "backend=auto")]
    lines += [(_backend_text(row.backend), row.method.value, row.runs_on, strategy_name(row.strategy), row.auto.__doc__,
               "yes" if row.in_auto else "no") for row in TABLE]
    lines.append(("(decoding)", "any", _ANYWHERE, strategy_name(DECODE)))
    return "\n".join(("    " + "".join(cell.ljust(w) for cell, w in zip(line[:-1], widths)) + line[-1]).rstrip()
                     for line in lines)


def auto_order() -> tuple[str, ...]:
    """The backends that ``backend="auto"`` tries, in the order it tries them."""
    return tuple(dict.fromkeys(_backend_text(row.backend) for row in TABLE if row.in_auto))


def _backend_text(backend: Backend | str) -> str:
    return str(getattr(backend, "value", backend))


def backend_names() -> tuple[str, ...]:
    """The values ``backend=`` accepts now: :data:`BACKENDS` and those :func:`add_backend` added."""
    return (*BACKENDS, *dict.fromkeys(row.backend for row in TABLE if not isinstance(row.backend, Backend)))


def add_backend(*rows: Row) -> None:
    """Add a backend: its rows (each a :class:`Row` whose ``backend`` is the new backend's name, a str)
    go after the table's, so they are its last priority for ``backend="auto"`` (give them
    ``in_auto=False`` to keep it out). From then on ``backend=`` and ``[attention].backend`` take the
    name; the ops, the sequence-parallel forms and the planner run its strategy as they run the shipped
    ones, by its attributes (:class:`~plsh_dist.ops.strategy.Strategy`). In every process that runs it
    (each rank of a sequence-parallel group)."""
    global TABLE
    for row in rows:
        if not isinstance(row.backend, str) or isinstance(row.backend, Backend) or row.backend in BACKENDS:
            raise ValueError(f"a new backend's rows name it by a str that is not a shipped backend, got "
                             f"{row.backend!r}")
    TABLE = (*TABLE, *rows)


def remove_backend(name: str) -> None:
    """Take the rows :func:`add_backend` added for ``name`` out of the table."""
    global TABLE
    if name in BACKENDS:
        raise ValueError(f"{name!r} is a shipped backend: only added ones can be removed")
    TABLE = tuple(row for row in TABLE if row.backend != name)


def _vocabulary(backend, method) -> tuple[Backend | str, Method]:
    try:
        backend = Backend(backend)
    except ValueError:
        if backend not in backend_names():
            raise ValueError(f"backend must be one of {backend_names()}, got {backend!r}") from None
    try:
        method = Method(method)
    except ValueError:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}") from None
    return backend, method


def choose_strategy(backend: str | Backend, method: str | Method, device: torch.device, dtype: torch.dtype,
                num_samples: int, *, decoding: bool = False, out_only: bool = False):
    """The strategy that computes PLSH for tensors of ``device`` / ``dtype`` with ``num_samples`` samples.

    ``decoding``: a KV-cache step (queries against cached keys, forward only).
    ``out_only``: the call needs the output alone (no gradient, no log-sum-exp), so output-only
    rows may answer.
    ValueErrors name ``backend`` or ``method`` and the fix.
    """
    backend, method = _vocabulary(backend, method)
    if decoding:
        return DECODE
    rows = [r for r in TABLE if (r.in_auto if backend is Backend.AUTO else r.backend == backend)]
    offered = [r for r in rows if method is Method.AUTO or r.method is method]
    for row in offered:
        if row.out_only and not out_only:
            continue
        if row.applies(device, dtype) and (method is not Method.AUTO or row.auto(num_samples)):
            return row.strategy
    needs = next((r.needs for r in offered if r.needs), "")
    if needs:
        raise ValueError(f"backend={_backend_text(backend)!r} needs {needs}; use backend='auto' to fall back to "
                         f"torch")
    raise ValueError(f"backend={_backend_text(backend)!r} has no method={method.value!r} strategy for {device.type} "
                     f"{dtype}; use method='auto'")
