"""What every attention bias is: the :class:`Bias` interface, the call it computes, and the
per-head scales all biases derive from ``AttentionConfig.sigma``.

Legend: B batch, T tokens (this rank's), Hq query heads, Hkv key/value heads, D head dim,
H heads of a weight matrix (Hq, or 1 when every head shares it).
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol

import torch

from plsh_dist.biases.cost import AttentionSetup, BiasCost
from plsh_dist.hashing import alibi_slopes


@dataclass(frozen=True)
class AttentionCall:
    """One full causal forward, as the model's attention hook hands it to a bias.

    Attributes:
        q: (B, T, Hq, D); k, v: (B, T, Hkv, D), Hq % Hkv == 0.
        positions: the ops' positions: LongTensor[T] (every row alike) or (B, T); compiled,
            the raw ``position_ids`` (laid out inside the custom op); under sequence
            parallelism, this rank's chunk's global positions.
        cu_seqlens: packed documents, flash-attn's offsets over the flattened (B, T) batch, or None.
        scale: softmax scale (None: ``D ** -0.5``).
        compiled: under ``torch.compile``: one custom op, which lays the positions out itself.
        group: the sequence-parallel process group (None: one process).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor | None
    cu_seqlens: torch.Tensor | None
    scale: float | None
    compiled: bool = False
    group: Any = None

    @property
    def num_heads(self) -> int:
        return self.q.shape[2]

    def common(self) -> dict[str, Any]:
        """The keyword arguments every public op takes alike."""
        return dict(positions=self.positions, causal=True, softmax_scale=self.scale, cu_seqlens=self.cu_seqlens)


class LayerSeeds(Protocol):
    """Where a seeded bias reads its layer's hash seed (a model's ``AttentionBinding``)."""

    def seed(self) -> int:
        """The seed of the current step, as a Python int (eager calls, decoding)."""

    def seed_tensor(self) -> torch.Tensor:
        """The same seed as an int64 scalar tensor (a compiled graph's input, not a constant)."""


class Bias(abc.ABC):
    """One positional bias of the attention: everything the package does with it, in one class.

    A subclass, in a file of its own, sets the class attributes and implements the abstract
    methods (a class that leaves one out cannot be built);
    :mod:`plsh_dist.biases` registers it under :attr:`name`. It is built from an
    ``AttentionConfig`` and reads only the fields in :attr:`fields`.
    """

    name: ClassVar[str]
    """``AttentionConfig.bias`` of this bias, as run configs and checkpoints store it."""
    spec: ClassVar[str]
    """Its name in an evaluation spec (``--modes plsh:s=8,...``)."""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other names an evaluation spec accepts."""
    options: ClassVar[dict[str, str]] = {"rope": "rope"}
    """Evaluation-spec option -> the ``AttentionConfig`` field it sets (``s`` -> ``num_samples``)."""
    positional: ClassVar[str | None] = None
    """The field a bare spec value sets (``window:512``); None: options are ``key=value`` only."""
    fields: ClassVar[tuple[str, ...]] = ("rope",)
    """The ``AttentionConfig`` fields it reads."""
    seeded: ClassVar[bool] = False
    """Whether it depends on the hash seed (evaluated under several seeds)."""
    hashed: ClassVar[bool] = False
    """Whether it is a hash's blocks (PLSH's strategy table chooses how it runs)."""
    summary: ClassVar[str] = ""
    """One line for documentation and ``--help``."""
    cost_model: ClassVar[type[BiasCost]]
    """Its cost for the planner (:mod:`plsh_dist.biases.cost`), made by :meth:`cost`."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f}={getattr(self.cfg, f)!r}' for f in self.fields)})"

    # --- configuration --------------------------------------------------------------------

    @classmethod
    def check_fields(cls, cfg) -> None:
        """Raise ValueError, naming the field and a valid value, when a field this bias owns is out
        of range. Every bias checks every config (a field keeps its meaning whatever the bias)."""

    @classmethod
    def check_spec(cls, overrides: dict[str, Any], item: str) -> dict[str, Any]:
        """An evaluation spec's parsed ``overrides`` (field -> value) -> the fields to set; ValueError
        naming ``item`` when they are incomplete or contradict each other."""
        return overrides

    def label(self) -> str:
        """What a one-line description of a run adds to ``bias=NAME rope=...``."""
        return ""

    # --- computing it ---------------------------------------------------------------------

    def forward(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """The full causal forward of ``call`` -> (B, T, Hq, D) in q's dtype (differentiable), in the form
        :meth:`form` picks."""
        return self.form(call)(call, seeds)

    def form(self, call: AttentionCall) -> Callable[[AttentionCall, LayerSeeds], torch.Tensor]:
        """The one place that picks how ``call`` is computed: :meth:`sequence_parallel` with a group
        (compiled or not: its functions are custom ops under ``torch.compile``), :meth:`compiled` under
        ``torch.compile``, else :meth:`one_process`. The model's hook calls the method it returns, so
        the choice adds no frame to the attention's calls."""
        if call.group is not None:
            return self.sequence_parallel
        if call.compiled:
            return self.compiled
        return self.one_process

    @abc.abstractmethod
    def one_process(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """One process, eagerly: ``call.positions`` / ``call.cu_seqlens`` are the ops' layout."""

    def compiled(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """One process under ``torch.compile``: one custom op, which lays the raw ``position_ids`` out itself
        and reads the seed as a tensor (:meth:`LayerSeeds.seed_tensor`). By default :meth:`one_process`,
        for a bias whose eager call is that op already (it reads ``call.compiled``)."""
        return self.one_process(call, seeds)

    @abc.abstractmethod
    def sequence_parallel(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        """This rank's chunk over ``call.group`` (:mod:`plsh_dist.distributed.sp.attention`'s functions,
        which are custom ops under ``torch.compile``: ``call.compiled`` says which seed to pass)."""

    @abc.abstractmethod
    def decode(self, q, k, v, q_pos, k_pos, scale, seeds: LayerSeeds) -> torch.Tensor:
        """A KV-cache step: q (B, Tq, Hq, D) at ``q_pos`` against k, v (B, Tk, Hkv, D) at ``k_pos``
        -> (B, Tq, Hq, D), the rows of one full forward (:mod:`plsh_dist.ops.decode`)."""

    def key_window(self, num_heads: int) -> int | tuple[int, ...] | None:
        """The keys a query reads: fewer than this many positions back (one int, or one per
        head); None: every earlier key (a window cache cannot serve it)."""
        return None

    @abc.abstractmethod
    def reference_weights(self, positions: torch.Tensor, num_heads: int, seed: int) -> torch.Tensor | None:
        """The weights ``W`` (H, T, T) float64 of :func:`plsh_dist.ops.reference.dense_attention` this
        bias applies at ``positions`` (LongTensor[T]) under hash ``seed``, from the definitions
        (slopes, hash blocks), not from the ops; None: no weights (plain attention)."""

    # --- its cost, for the planner (plsh_dist.plan) -----------------------------------------

    def samples(self) -> int:
        """Hash samples one call computes (1 for the exact biases)."""
        return 1

    def cost(self, num_heads: int, strategy) -> BiasCost:
        """Its :class:`~plsh_dist.biases.cost.BiasCost` (a :attr:`cost_model`) with ``num_heads`` query
        heads, where PLSH's table chooses ``strategy`` (the row the op would take on the run's device:
        how a hashed bias runs; the others only read whether it is CUDA's varlen row)."""
        cfg = self.cfg
        windows = self.key_window(num_heads)
        head_windows = windows if isinstance(windows, tuple) or windows is None else (windows,) * num_heads
        setup = AttentionSetup(bias=self.name, sigma=sigma_per_head(cfg.sigma, num_heads),
                               per_head_hash=cfg.sigma is None, num_samples=self.samples(),
                               onepass=strategy.onepass and self.hashed, varlen=strategy.cost_model == "varlen",
                               window=max(head_windows) if head_windows else cfg.window, chunk_size=cfg.chunk_size,
                               head_windows=head_windows, fused=strategy.cost_model == "fused" and self.hashed,
                               sampler=cfg.sampler)
        return self.cost_model(self, setup)


def _graph_constant(fn):
    """``functools.lru_cache`` whose results a compiled graph takes as constants: dynamo calls the
    function (a pure function of its hashable arguments) instead of tracing its host code."""
    cached = functools.lru_cache(maxsize=64)(fn)

    @functools.wraps(fn)
    def call(*args):
        return cached(*args)

    return torch.compiler.assume_constant_result(call)


@_graph_constant
def head_scales(sigma: float | None, num_heads: int):
    """Per-head ``(sigma, slopes)`` of a config's ``sigma`` (cached; do not modify).

    ``sigma is None``: ALiBi's slopes ``m_h`` and ``sigma_h = 1 / m_h``
    (Tensor[Hq] each). A float: ``sigma`` itself (one hash shared by all heads)
    and slopes ``1 / sigma`` on every head. Both stay on the CPU, float32:
    the ops build hashes and bias tables from CPU values, so a device copy
    would only add a sync.
    """
    if sigma is None:
        slopes = alibi_slopes(num_heads)
        sig = slopes.reciprocal()
    else:
        slopes = torch.full((num_heads,), 1.0 / sigma, dtype=torch.float32)
        sig = float(sigma)
    return sig, slopes


@_graph_constant
def hash_sigma(sigma: float | None, num_heads: int, device: torch.device) -> torch.Tensor:
    """The hash's sigma as ``plsh_dist::block_attention`` takes it: float64 Tensor[H] (H = 1 for one
    hash shared by all heads) on ``device``, made once. A GPU draws the hash there, from a sigma there;
    a copy from the host at every call could not be captured in a CUDA graph."""
    sig, _ = head_scales(sigma, num_heads)
    sig = sig if isinstance(sig, torch.Tensor) else torch.tensor([float(sig)])
    return sig.to(device, torch.float64)


def sigma_per_head(sigma: float | None, num_heads: int) -> tuple[float, ...]:
    """``head_scales``'s sigma as one float per query head (a constant repeated)."""
    sig, _ = head_scales(sigma, num_heads)
    return tuple(float(x) for x in sig) if isinstance(sig, torch.Tensor) else (float(sig),) * num_heads
