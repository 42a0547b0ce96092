"""The attention biases, one file each, and their registry.

Each bias (:class:`~plsh_dist.biases.base.Bias`) owns its config fields' checks, its
evaluation-spec syntax, its forward (one process, compiled, sequence-parallel), decoding,
reference weights and planner cost; the rest of the package asks the registry for the bias a
config names and never branches on the name. A new bias is one new file and one line in
:data:`BIASES` (or :func:`register_bias`, for a bias kept outside the package).
"""

from __future__ import annotations

from plsh_dist.biases.alibi import ExactAlibi
from plsh_dist.biases.base import AttentionCall, Bias, LayerSeeds, hash_sigma, head_scales
from plsh_dist.biases.fixed_blocks import FixedBlocksBaseline
from plsh_dist.biases.none import NoBias
from plsh_dist.biases.plsh import PLSH
from plsh_dist.biases.truncated import TruncatedAlibi
from plsh_dist.biases.window import WindowedAlibi

#: ``AttentionConfig.bias`` -> its class, in documentation order.
BIASES: dict[str, type[Bias]] = {cls.name: cls for cls in (
    NoBias, ExactAlibi, PLSH, FixedBlocksBaseline, WindowedAlibi, TruncatedAlibi,
)}


def register_bias(cls: type[Bias]) -> type[Bias]:
    """Add ``cls`` to :data:`BIASES` under ``cls.name`` (a lab's or a test's bias); returns it."""
    if not (isinstance(cls, type) and issubclass(cls, Bias)):
        raise ValueError(f"register_bias takes a Bias subclass, got {cls!r}")
    taken = {name for other in BIASES.values() if other.name != cls.name for name in (other.spec, *other.aliases)}
    if cls.name in BIASES and BIASES[cls.name] is not cls or {cls.spec, *cls.aliases} & taken:
        raise ValueError(f"bias {cls.name!r} (spec {cls.spec!r}) is already registered")
    BIASES[cls.name] = cls
    return cls


def bias_class(name: str) -> type[Bias]:
    """The class of ``AttentionConfig.bias`` ``name``; ValueError listing the known ones."""
    try:
        return BIASES[name]
    except KeyError:
        raise ValueError(f"attention.bias must be one of {tuple(BIASES)}, got {name!r}") from None


def bias_for(cfg) -> Bias:
    """The bias object of an ``AttentionConfig``."""
    return bias_class(cfg.bias)(cfg)


__all__ = ["AttentionCall", "Bias", "BIASES", "LayerSeeds", "bias_class", "bias_for", "hash_sigma", "head_scales",
           "register_bias"]
