"""Safe reading of checkpoint files: tensors and a few known classes, never arbitrary pickles.

``torch.load(..., weights_only=False)`` (what DeepSpeed's own
``TorchCheckpointEngine.load`` does) runs any callable a pickle names, so a
planted or tampered ``*.pt`` file executes code on every rank that resumes
from it. Here every read goes through ``torch.load(weights_only=True)``, which
rebuilds only tensors, containers and primitive types, plus the classes in
``safe_globals()`` below, each one found by loading the checkpoints of ZeRO
stages 0-3 and listed with the reason it appears.

Any failure to read a file (missing, truncated zip, bad pickle, refused class)
becomes a ``CheckpointLoadError`` that names the file and says how to go on.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch


def safe_globals() -> list:
    """Non-tensor classes DeepSpeed 0.19 stores in its checkpoint files (model states need none).

    Imported here, not at module level: importing deepspeed takes seconds and
    ``plsh_dist.train`` must stay cheap to import.
    """
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [
        # Python 3.11.0-3.11.4 (Debian 12's 3.11.2: the CPU image) pickle an Enum member as
        # getattr(cls, name), later versions as cls(value): "builtins.getattr" is answered by a
        # function that looks up members of the safe Enums below and refuses anything else.
        (_enum_member, "builtins.getattr"),
        # ZeRO 1-3 optimizer shards (*_optim_states.pt) pickle the optimizer's
        # static loss scaler object itself (fp32 and bf16 runs use the static one).
        LossScaler,
        # ZeRO 1-3 optimizer shards store the stage as this Enum ("zero_stage").
        ZeroStageEnum,
        # ZeRO 1-2 optimizer shards map each parameter to its slice of the flat
        # partition ("param_slice_mappings"): a namedtuple (start, numel).
        fragment_address,
    ]


def _enum_member(cls: Any, name: str) -> Any:
    """``getattr(cls, name)`` as old pickles of Enum members use it, for the safe Enums only."""
    from deepspeed.runtime.zero.config import ZeroStageEnum

    if cls in (ZeroStageEnum,) and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(f"getattr({getattr(cls, '__name__', cls)!r}, {name!r}) is not a member of a safe Enum")


class CheckpointLoadError(RuntimeError):
    """A checkpoint file could not be read safely; the message names the file and the way out.

    ``every_rank``: every rank raises it alike (the collective manifest check),
    rather than only the rank that read the file (refusal.py prints it once).
    """

    def __init__(self, message: str, *, every_rank: bool = False):
        super().__init__(message)
        self.every_rank = every_rank


def safe_torch_load(path: str | Path, map_location: Any = "cpu", *, advice: str = "", mmap: bool = False) -> Any:
    """``torch.load`` with ``weights_only=True`` and ``safe_globals()``; clear errors.

    ``advice``: what the user should do instead (appended to the message),
    e.g. which earlier checkpoint to resume from. ``mmap``: map the file's
    tensors instead of reading them (only what is used is paged in).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointLoadError(f"checkpoint file {path} does not exist. {advice}".rstrip())
    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as exc:  # noqa: BLE001 - every way a file can be bad ends in the same clear error
        reason = _reason(exc)
        # The weights-only unpickler names a GLOBAL when a pickle asks for a callable or class.
        what = ("refused to unpickle it: it names a class or function outside the safe list "
                "(a tampered or foreign file?)" if "GLOBAL" in reason else "it is damaged or truncated")
        raise CheckpointLoadError(
            f"cannot load checkpoint file {path}: {what} [{type(exc).__name__}: {reason}]. {advice}".rstrip()
        ) from exc


def _reason(exc: Exception) -> str:
    """The part of torch's message that says what is wrong, on one line.

    A weights-only failure opens with generic text (including the unsafe hint
    to retry with ``weights_only=False``) and closes with a docs link; the
    reason sits between them ("Unsupported operand 149", "unsupported GLOBAL
    posix.system ..."). Other errors (truncated zip, missing record) say it in
    their first line.
    """
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    if text.startswith("Weights only load failed"):
        body = text.split("Check the documentation")[0]
        body = body.split("WeightsUnpickler error:")[-1] if "WeightsUnpickler error:" in body else body.split("\n", 1)[-1]
        return " ".join(body.split()) or "weights-only unpickling failed"
    return text.splitlines()[0]


class SafeLoadCheckpointEngine:
    """DeepSpeed checkpoint engine whose ``load`` is ``safe_torch_load``; everything else
    (save, makedirs, commit...) goes to the engine it wraps, so writing is unchanged.
    It has the methods of deepspeed's ``CheckpointEngine`` without subclassing it
    (DeepSpeed never checks the type), so this module imports no deepspeed.

    ``advice``: appended to every load error (set per load by the caller).
    """

    def __init__(self, inner, advice: str = ""):
        self.inner = inner
        self.name = f"SafeLoad({getattr(inner, 'name', type(inner).__name__)})"
        self.advice = advice

    def load(self, path: str, map_location=None):
        return safe_torch_load(path, map_location=map_location, advice=self.advice)

    def create(self, info):
        return self.inner.create(info)

    def save(self, state_dict, path: str):
        return self.inner.save(state_dict, path)

    def commit(self, info):
        return self.inner.commit(info)

    def makedirs(self, path, exist_ok=False):
        return self.inner.makedirs(path, exist_ok=exist_ok)

    def is_data_parallel_writer(self, dp_rank):
        return self.inner.is_data_parallel_writer(dp_rank)

    def is_decoupled(self):
        return self.inner.is_decoupled()

    def set_commit_info(self, info):
        return self.inner.set_commit_info(info)

    def get_commit_info(self):
        return self.inner.get_commit_info()

    def cleanup(self):
        return self.inner.cleanup()

    def preserves_storage_sharing(self):
        return self.inner.preserves_storage_sharing()

    def __getattr__(self, name: str):
        # Only reached for attributes this class lacks (anything a later DeepSpeed adds).
        return getattr(self.__dict__["inner"], name)


def install_safe_loader(engine, advice: str = "") -> SafeLoadCheckpointEngine:
    """Make every file DeepSpeed's ``engine.load_checkpoint`` reads go through ``safe_torch_load``.

    Idempotent: a second call only updates ``advice``.
    """
    current = engine.checkpoint_engine
    if not isinstance(current, SafeLoadCheckpointEngine):
        current = SafeLoadCheckpointEngine(current)
        engine.checkpoint_engine = current
    current.advice = advice
    return current
