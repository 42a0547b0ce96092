"""What a caller needs to know of a PLSH strategy, said by the strategy itself.

Every strategy class (one per file: ``cpu/onepass.py``, ``triton/attention.py``, ...) derives from
:class:`Strategy` and overrides the attributes that differ from the defaults here. The table
(:mod:`plsh_dist.ops.backends`) chooses the strategy once per call; the callers (the op and its
backward, the sequence-parallel forms, the planner) read these attributes and never test the
strategy's type.
"""

from __future__ import annotations


class Strategy:
    """The attributes of a strategy, with their defaults (class attributes, not dataclass fields)."""

    onepass: bool = False
    """It computes the one-pass form (one attention with the bias ``log c_ij``), not s merged samples."""

    keeps_host_state: bool = False
    """Eagerly, its forward's ``saved`` (host state: the CUDA varlen calls, the fused kernel's band
    tables) is kept for its backward by :class:`~plsh_dist.ops.plsh.PLSHAttentionFunction`, so the
    backward neither syncs nor rebuilds; otherwise an eager call runs through the custom op too."""

    backward_takes_saved: bool = False
    """Its backward needs its forward's ``saved`` (cannot rebuild it), so the op's backward, which keeps
    nothing from the forward, runs the forward again to remake it."""

    output_only: bool = False
    """It computes the output alone (``attend``, no ``forward`` / ``backward``): the table gives it only
    to calls that need neither gradients nor the log-sum-exp."""

    device_positions: bool = False
    """It builds its layout on the device: the op leaves raw ``position_ids`` (and packed offsets) there
    (:func:`~plsh_dist.ops.layout.device_layout`) instead of laying them out on the host."""

    cost_model: str = "pairs"
    """How the planner costs it (:mod:`plsh_dist.plan.attention_cost`): ``"pairs"``, the query-key
    pairs of its blocks or band on dense calls; ``"varlen"``, also the CUDA varlen kernels' workspace;
    ``"fused"``, the tiles the fused kernel visits."""
