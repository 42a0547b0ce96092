"""The one vocabulary of attention modes: ``[attention].bias``, evaluation specs, the replication grid.

Each mode is one positional bias the attention function computes
(:data:`plsh_dist.models.attention.BIAS_FUNCTIONS` holds its forward and decoding
functions). A run config names it by ``bias``; an evaluation spec
(:mod:`plsh_dist.eval.mode_specs`, ``--modes plsh:s=8,alibi,fixed,window:512,none``)
by ``spec`` or one of its ``aliases``, with the ``options`` listed here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionMode:
    """One attention mode.

    Attributes:
        bias: its ``AttentionConfig.bias``.
        spec: its name in an evaluation spec (and the replication grid's evaluation mode).
        aliases: other names an evaluation spec accepts.
        options: the options an evaluation spec may give it (``plsh:s=8``).
        seeded: whether it depends on the hash seed (evaluated under several seeds; its
            layers draw seeds from the seed context).
        summary: one line for documentation.
    """

    bias: str
    spec: str
    aliases: tuple[str, ...]
    options: tuple[str, ...]
    seeded: bool
    summary: str


#: Every mode, keyed by ``bias``, in documentation order.
MODES: dict[str, AttentionMode] = {m.bias: m for m in (
    AttentionMode("none", "none", (), ("rope",), False, "plain causal attention; positions only via rope"),
    AttentionMode("alibi", "alibi", (), ("sigma", "rope", "chunk"), False, "exact ALiBi"),
    AttentionMode("plsh", "plsh", (), ("s", "num_samples", "sigma", "sampler", "rope"), True,
                  "positional-LSH estimate of ALiBi"),
    # One mode, two spellings of it: "fixed_blocks" in run configs and checkpoints, "fixed" (or
    # "fixed_blocks") in evaluation specs and the reports written from them; both stay accepted.
    AttentionMode("fixed_blocks", "fixed", ("fixed_blocks",), ("sigma", "rope"), False,
                  "the paper's fixed-blocks baseline: pitch 2*sigma, one sample"),
    AttentionMode("window", "window", (), ("w", "window", "sigma", "rope", "chunk"), False,
                  "exact ALiBi on a sliding window"),
    AttentionMode("truncated", "truncated", (), ("s", "num_samples", "c", "sigma", "rope", "chunk"), False,
                  "exact ALiBi on a window per head, w_h = ceil(c * sigma_h)"),
)}

#: An evaluation spec's option -> the ``AttentionConfig`` field it sets.
OPTION_FIELDS = {"s": "num_samples", "num_samples": "num_samples", "sigma": "sigma", "sampler": "sampler",
                 "w": "window", "window": "window", "rope": "rope", "chunk": "chunk_size", "c": "truncate_c"}

#: The values ``[attention].bias`` accepts.
BIASES = tuple(MODES)
