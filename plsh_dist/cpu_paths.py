"""One set of CPU code paths, so that pinned numbers agree on any x86-64 CPU.

torch's CPU wheel picks its arithmetic by the processor it finds: ATen's
vectorised kernels by the widest instruction set (AVX-512 or AVX2), MKL's GEMM
by vendor and model (Intel's AVX-512 kernels, AMD's own). Each choice sums in
another order, and a few training steps of Adam amplify the last-bit
differences to ~1e-5 in a gradient norm. Runs whose numbers are pinned (the
golden losses, the quickstart's printed figures) therefore set one path for
every choice, through the environment variables the installed torch honours
(what they leave, across CPU models: results/cpu_paths/README.md):

- ``ATEN_CPU_CAPABILITY=avx2``: ATen's kernels (``torch.backends.cpu.get_cpu_capability()``
  then reports ``AVX2``; a CPU without AVX2 reports less, and ``code_paths`` shows it);
- ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility in its one
  branch that runs on Intel and AMD alike (``AVX2`` is ignored on AMD: MKL stays on AUTO);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's JIT kernels, where torch calls them;
- ``OMP_NUM_THREADS=1``: reductions are split per thread, so the thread count is fixed.

They are read when torch first dispatches, so they must be in a process's
environment before it imports torch: ``pinned_cpu_env`` builds the
environment for a child process.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from pathlib import Path

PINNED_CPU_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
}

# mkl_service.h's branch numbers (MKL_CBWR_BRANCH = 1 asks for the branch in force).
_MKL_BRANCHES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                 8: "SSE4_2", 9: "AVX", 10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}


def pinned_cpu_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with the pinned CPU code paths, for a child process."""
    return {**(os.environ if base is None else base), **PINNED_CPU_ENV}


def _mkl_branch() -> str:
    """MKL's reproducibility branch in force in this process ('unknown' where torch has no MKL)."""
    import torch

    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        branch = lib.mkl_serv_cbwr_get(1)
    except (OSError, AttributeError):
        return "unknown"
    return _MKL_BRANCHES.get(branch, str(branch))


def code_paths() -> dict[str, str]:
    """The CPU code paths this process's torch runs: what a pinned number depends on."""
    import torch

    return {"aten_cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": _mkl_branch(),
            "threads": str(torch.get_num_threads())}
