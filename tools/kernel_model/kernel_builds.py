"""The Triton kernels' builds exactly as the JIT makes them, without a GPU.

Triton's JIT specialises every build on its real arguments: pointers whose
address is a multiple of 16 and integers divisible by 16 (strides, lengths)
get alignment hints, an integer equal to 1 becomes a constant, and the
constexprs and launch options (``num_warps``, ``num_stages``) come from the
call. A build made by hand from a signature misses the hints (scalar loads
instead of 16-byte ones, other registers): it is not the code that runs.

So the builds here come from the launchers themselves, in two steps:

1. :func:`record` runs the project's own entry points (the table's
   :class:`~plsh_dist.ops.triton.attention.TritonOnePass` for the PLSH count,
   :func:`~plsh_dist.ops.triton.attention.alibi_window_attention` for the
   window, the calibration kernels of :mod:`tools.kernel_model.flash_calibration`)
   on CPU tensors of the benchmark's shapes, forward and backward, in a
   process under Triton's interpreter whose kernel launches are recorded
   and not run: which kernel, its arguments (a tensor as its dtype and
   address modulo 256), the grid and the keyword arguments. Whatever kernels
   and tiles the launchers choose are what is recorded.
2. :func:`build` hands each recorded launch to the kernel's own
   ``JITFunction.run(..., warmup=True)`` (compile, do not launch) with a
   driver stand-in that reports the target GPU (``GPUTarget("cuda", arch,
   32)``): the JIT computes its specialisation from the arguments and calls
   ``triton.compile`` itself. The result is the JIT's ``CompiledKernel``
   (``asm["cubin"]``, ``asm["ttir"]``, ``metadata``).

The launchers pick their tiles from the device's compute capability; on the
CPU the recorder makes the launcher's ``_arch`` hook answer the target's.
Step 2 must run without ``TRITON_INTERPRET`` (the interpreter replaces the
compiler), step 1 with it: :func:`record` starts its own process.

Legend: B batch, T tokens, H heads (query = key/value heads), D head dim, s samples.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: The table's names of the kernels, by the Triton function's name (the shipped kernels and the
#: calibration's); a launch of any other kernel is kept under its own name.
KERNEL_NAMES = {
    "onepass_fwd_kernel": "fwd", "onepass_bwd_dkdv_kernel": "bwd_dkdv", "onepass_bwd_dq_kernel": "bwd_dq",
    "flash_fwd_kernel": "fwd", "flash_bwd_dkdv_kernel": "bwd_dkdv", "flash_bwd_dq_kernel": "bwd_dq",
}
#: The module of the kernels that build the attention's tables (not recorded; their builds:
#: ``tests/ops/triton_kernel/test_device_tables.py``).
TABLE_KERNELS = "plsh_dist.ops.triton.table_kernels"
BIASES = ("count", "window", "none")
DTYPES = ("bf16", "fp16")
HEAD_DIMS = (64, 128)
ARCHS = (90, 80)
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class Case:
    """One call of an entry point, forward and backward, on CPU tensors (B = 1).

    Attributes:
        bias: "count" (PLSH one pass, per-head sigma = 1 / ALiBi slope), "window" (exact ALiBi
            in per-head windows, the truncated mode's at s samples' cost) or "none" (the
            calibration: plain causal flash attention).
        dtype: "bf16" or "fp16". head_dim: D. arch: compute capability, 90 or 80.
        tokens, heads: T and H (the benchmark's: 8192 and 16). samples: s.
        documents: 0 for one sequence, else that many equal documents in the row.
    """

    bias: str
    dtype: str
    head_dim: int
    arch: int
    tokens: int = 8192
    heads: int = 16
    samples: int = 8
    documents: int = 0
    causal: bool = True

    def __post_init__(self):
        if self.bias not in BIASES:
            raise ValueError(f"bias must be one of {BIASES}, got {self.bias!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")


@dataclass
class Launch:
    """One recorded kernel launch.

    Attributes:
        module, function: where the ``@triton.jit`` kernel lives.
        grid: the launch grid.
        args: positional arguments, JSON-able: a tensor as ``{"tensor": dtype, "ptr_mod": address
            % 256}``, scalars as themselves.
        kwargs: keyword arguments (constexprs, ``num_warps``, ``num_stages``).
        case: the :class:`Case` it came from (as a dict).
    """

    module: str
    function: str
    grid: list
    args: list
    kwargs: dict
    case: dict = field(default_factory=dict)

    @property
    def kernel(self) -> str:
        return KERNEL_NAMES.get(self.function, self.function)

    def option(self, name: str):
        return self.kwargs.get(name)


# -- step 1: record (a process under the interpreter) ------------------------------------------


def _encode(value):
    import torch  # noqa: PLC0415

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "ptr_mod": value.data_ptr() % 256}
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"cannot record a kernel argument of type {type(value).__name__}")


def _run_case(case: Case) -> None:
    """The case's entry point, forward then backward, on CPU tensors (kernels not run)."""
    import torch  # noqa: PLC0415

    from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: PLC0415
    from plsh_dist.ops.documents import Documents  # noqa: PLC0415

    dtype = getattr(torch, _TORCH_DTYPES[case.dtype])
    T, H, D = case.tokens, case.heads, case.head_dim
    q, k, v = (torch.zeros(1, T, H, D, dtype=dtype) for _ in range(3))
    positions = torch.arange(T)
    docs = None
    if case.documents:
        ids = torch.arange(T) * case.documents // T
        docs = Documents(ids, positions - (ids * T // case.documents))
    sigma = alibi_slopes(H).double().reciprocal()
    scale = D ** -0.5
    if case.bias == "count":
        from plsh_dist.ops.triton.attention import TritonOnePass  # noqa: PLC0415

        strategy, lsh = TritonOnePass(), PositionalLSH(sigma, case.samples, seed=0)
        out, lse, saved = strategy.forward(q, k, v, lsh, positions, causal=case.causal, scale=scale, docs=docs)
        strategy.backward(torch.zeros_like(out), q, k, v, out, lse, lsh, positions, causal=case.causal, scale=scale,
                          docs=docs, saved=saved)
    elif case.bias == "window":
        from plsh_dist.ops.alibi import equal_cost_c, truncation_windows  # noqa: PLC0415
        from plsh_dist.ops.triton.attention import alibi_window_attention  # noqa: PLC0415

        q, k, v = (x.requires_grad_() for x in (q, k, v))
        window = truncation_windows(equal_cost_c(case.samples), sigma)
        out, _ = alibi_window_attention(q, k, v, sigma=sigma.float(), window=window, positions=positions,
                                        causal=case.causal, softmax_scale=scale, docs=docs)
        out.backward(torch.zeros_like(out))
    else:
        from tools.kernel_model import flash_calibration  # noqa: PLC0415

        if case.documents or not case.causal:
            raise ValueError("the calibration is plain causal attention: no documents, causal only")
        out, lse = flash_calibration.forward(q, k, v, scale=scale, arch=case.arch // 10)
        flash_calibration.backward(torch.zeros_like(out), q, k, v, out, lse, scale=scale, arch=case.arch // 10)


def _record_main() -> None:
    """Entry of the recording process: cases (JSON list) on stdin, launches (JSON list) on stdout."""
    import triton  # noqa: F401, PLC0415
    from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415

    from plsh_dist.ops.triton import attention as triton_onepass  # noqa: PLC0415

    if not triton_onepass.interpreting():
        raise SystemExit("the recorder must run under TRITON_INTERPRET=1")
    launches: list[Launch] = []
    current: dict = {}

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        if fn.__module__ == TABLE_KERNELS:  # the attention's inputs, once a call: not a tile's cost
            return
        launches.append(Launch(fn.__module__, fn.__name__, [int(g) for g in grid], [_encode(a) for a in args],
                               {k: _encode(v) for k, v in kwargs.items()}, dict(current)))

    InterpretedFunction.run = run
    triton_onepass.kernels()  # the launcher's own module set-up
    if not hasattr(triton_onepass, "_arch"):
        raise SystemExit("plsh_dist.ops.triton.attention has no _arch(device) hook: the recorder needs the launcher "
                         "to pick its tiles through it (compute capability major of the device)")
    for spec in json.load(sys.stdin):
        case = Case(**spec)
        current.clear()
        current.update(asdict(case))
        triton_onepass._arch = lambda device, major=case.arch // 10: major
        _run_case(case)
    json.dump([asdict(x) for x in launches], sys.stdout)


def record(cases: list[Case], root: Path | None = None, timeout: float = 600) -> list[Launch]:
    """Launches of every case, in order, recorded in a fresh process under the interpreter
    (module doc, step 1). ``root``: the checkout whose ``plsh_dist`` is recorded (this one's)."""
    root = root or Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", "from tools.kernel_model.kernel_builds import _record_main; "
                           "_record_main()"], input=json.dumps([asdict(c) for c in cases]), capture_output=True,
                          text=True, env=env, cwd=root, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"recording the launches failed:\n{proc.stderr[-4000:]}")
    return [Launch(**x) for x in json.loads(proc.stdout)]


# -- step 2: build as the JIT ---------------------------------------------------------------------


class _ArgTensor:
    """A recorded tensor as the JIT's specialisation sees one: its dtype and its address."""

    def __init__(self, dtype: str, ptr_mod: int):
        import torch  # noqa: PLC0415

        self.dtype = getattr(torch, dtype)
        self._ptr = (1 << 20) + ptr_mod

    def data_ptr(self) -> int:
        return self._ptr


class _TargetDriver:
    """Triton's driver interface, as far as ``JITFunction.run(warmup=True)`` asks it: the target
    GPU, device 0, stream 0. Nothing is loaded or launched."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget  # noqa: PLC0415

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def _decode(value):
    return _ArgTensor(value["tensor"], value["ptr_mod"]) if isinstance(value, dict) and "tensor" in value else value


def build(launch: Launch, arch: int | None = None):
    """The JIT's ``CompiledKernel`` for ``launch`` on ``sm_<arch>`` (default: the case's arch).

    The kernel's ``JITFunction`` specialises on the recorded arguments and compiles
    (``warmup=True``: no launch); Triton's cache makes a repeated build cheap.
    """
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter does not compile")
    from triton.runtime.driver import driver  # noqa: PLC0415
    from triton.runtime.jit import JITFunction  # noqa: PLC0415

    arch = arch or launch.case["arch"]
    fn = getattr(importlib.import_module(launch.module), launch.function)
    if not isinstance(fn, JITFunction):
        raise RuntimeError(f"{launch.module}.{launch.function} is not a JIT function here: is TRITON_INTERPRET set?")
    previous = driver.active if driver._active is not None else None
    driver.set_active(_TargetDriver(arch))
    fn.device_caches.clear()  # the binder holds the target: one per build's arch
    try:
        kernel = fn.run(*map(_decode, launch.args), grid=launch.grid, warmup=True,
                        **{k: _decode(v) for k, v in launch.kwargs.items()})
    finally:
        driver.set_active(previous)
        fn.device_caches.clear()
    return kernel.result() if hasattr(kernel, "result") else kernel
