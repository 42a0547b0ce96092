"""Where Triton's kernels run: is Triton importable, is this process its CPU interpreter, and may
tensors on a device be launched on.

Shared by the attention kernels' launchers (:mod:`plsh_dist.ops.triton.attention`), the table
kernels' (each table's builder beside its host form: ``tile_bands``, ``kernel_bias``, ``near_runs``,
``token_layout``; and ``plsh_dist::layer_seed``) and the samplers' (``device_draws``). Imports Triton
only when asked.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch


@functools.lru_cache(maxsize=1)
def triton_status() -> str | None:
    """None when Triton can be imported, else one line saying why not."""
    try:
        import triton  # noqa: F401, PLC0415 (optional: pip install triton)
    except Exception as err:  # ImportError, or a broken install raising at import
        return f"triton is not importable ({type(err).__name__}: {err}); pip install 'triton>=3.6'"
    if importlib.util.find_spec(f"{__package__}.kernels") is None:
        # a copy of the ops without the kernels: an export's bundled code (plsh_dist.models.remote_code)
        return "the Triton kernels are not part of this copy of plsh_dist's code; install plsh_dist"
    return None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter: ``TRITON_INTERPRET=1`` was set
    before ``triton`` was imported (Triton decorates its own library at import, so the
    variable set later does not switch it)."""
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime.jit import JITFunction  # noqa: PLC0415

    return not isinstance(tl.standard.zeros, JITFunction)


def prepare_interpreter() -> None:
    """Under the interpreter, make it run on this numpy (no-op when compiling)."""
    if interpreting():
        _interpreter_numpy_compat()


@functools.lru_cache(maxsize=None)
def kernels_module(name: str):
    """The kernels module ``plsh_dist.ops.triton.<name>`` (imports Triton), ready to launch: compiled, or
    interpreted when :func:`interpreting`; a RuntimeError says why Triton is missing."""
    why = triton_status()
    if why is not None:
        raise RuntimeError(f"the Triton kernel needs Triton: {why}")
    module = importlib.import_module(f"{__package__}.{name}")  # beside this module (plsh_dist.ops.triton)
    prepare_interpreter()
    return module


def launcher(name: str, device: torch.device):
    """:func:`kernels_module` ``name`` for tensors on ``device`` (:func:`check_device`)."""
    module = kernels_module(name)
    check_device(device)
    return module


def table_kernels(device: torch.device):
    """The table kernels' module (``table_kernels.py``) for tensors on ``device``. Each table's module binds
    it as its ``launch``, which tests wrap to count that table's launches."""
    return launcher("table_kernels", device)


def check_device(device: torch.device) -> None:
    """Kernels take CUDA tensors, or CPU tensors under the interpreter; a ValueError says how otherwise."""
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"the Triton kernel on {device.type} tensors runs under Triton's interpreter: set "
            "TRITON_INTERPRET=1 before the process imports triton, or pass CUDA tensors"
        )


def _interpreter_numpy_compat() -> None:
    """Triton's interpreter (3.6) turns a scalar into a 1-element array and ``int()``s it for
    ``range()``; numpy >= 2.4 refuses ``int()`` of a 1-d array. Give the interpreter's
    tensors an ``__index__`` that takes the element (no change where numpy still accepts it)."""
    import numpy as np  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    try:
        int(np.zeros(1, dtype=np.int64))
        return
    except TypeError:
        pass
    original = interpreter._patch_lang_tensor
    if getattr(original, "_plsh_compat", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._plsh_compat = True
    interpreter._patch_lang_tensor = patched
