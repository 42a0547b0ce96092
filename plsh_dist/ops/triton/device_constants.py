"""Small host constants (a hash's sigma, ALiBi's slopes and windows) on a device, made once.

The models pass these constants as CPU tensors (constants of a compiled graph). Copying one to
the GPU at every call would make the call impossible to capture in a CUDA graph: a copy from
pageable host memory is refused during a capture (or, where it is not, replays read host memory
that may be gone). So each distinct constant is copied (and checked) once, at its first call (a
warm-up step), and later calls, a capture among them, find the copy by the constant's bytes,
with no torch op and no copy.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

#: most constants kept: a model has a few (one per bias config and head count); the oldest go first
MAX_CONSTANTS = 256
_made: dict[tuple, object] = {}
T = TypeVar("T")


def host_key(x: torch.Tensor) -> tuple:
    """What identifies a CPU tensor's value, read with no torch op: dtype, shape and bytes."""
    flat = x.detach().reshape(-1)
    return str(x.dtype), tuple(x.shape), flat.view(torch.uint8).numpy().tobytes()


def device_constant(key: tuple, make: Callable[[], T]) -> T:
    """``make()``, made once per ``key`` (a hashable description of its value and device) and kept
    until :data:`MAX_CONSTANTS` newer ones were made. Do not modify what it returns."""
    if key not in _made:
        if len(_made) >= MAX_CONSTANTS:
            del _made[next(iter(_made))]
        _made[key] = make()
    return _made[key]


def on_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device``: itself if it is there, else a copy (kept, and found again by the bytes of a
    CPU tensor with :func:`device_constant`)."""
    device = torch.device(device)
    if x.device == device:
        return x
    if x.device.type != "cpu":
        return x.to(device)
    return device_constant(("on_device", str(device), *host_key(x)),
                           lambda: x.detach().to(device, copy=True).contiguous())
