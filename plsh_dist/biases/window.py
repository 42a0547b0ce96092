"""Sliding-window ALiBi: exact ALiBi over the keys less than ``window`` positions back.

A rank under sequence parallelism receives a halo of ``window - 1`` positions.
"""

from __future__ import annotations

from plsh_dist.biases.alibi import AlibiCost, ExactAlibi
from plsh_dist.biases.cost import CallShape
from plsh_dist.distributed.halo import window_needs


class WindowCost(AlibiCost):
    """Each head's window (pairs, the chunks' key span) and a halo of the widest under SP."""

    def pairs_per_head(self, T: int) -> list[float]:
        """``sum_i min(i + 1, w_h)`` per head."""
        return window_pairs(T, self.setup.head_windows)

    def chunk_span(self, keys: int, chunk: int) -> int:
        return min(keys, self.setup.window) + chunk  # the widest head's window bounds every group's

    def sp_needs(self, chunks, shape: CallShape, seed: int):
        """A halo of the (widest) window's ``w - 1`` positions before the chunk."""
        return window_needs(self.setup.window, chunks, shape.kv_heads, causal=True)


class WindowedAlibi(ExactAlibi):
    """Exact ALiBi on a sliding window of ``AttentionConfig.window`` tokens (the query included)."""

    name = spec = "window"
    options = {"w": "window", "window": "window", "sigma": "sigma", "rope": "rope", "chunk": "chunk_size"}
    positional = "window"  # "window:512"
    fields = ("sigma", "rope", "chunk_size", "window")
    summary = "exact ALiBi on a sliding window"
    cost_model = WindowCost

    @classmethod
    def check_fields(cls, cfg) -> None:
        if cfg.window < 1:
            raise ValueError(f"attention.window must be an int >= 1 (tokens), got {cfg.window!r}; e.g. window = 512")

    @classmethod
    def check_spec(cls, overrides, item):
        if "window" not in overrides:
            raise ValueError(f"mode {item!r}: a window mode needs its width, e.g. window:512")
        return overrides

    def key_window(self, num_heads: int) -> int:
        return self.cfg.window


def window_pairs(T: int, windows) -> list[float]:
    """``sum_{i < T} min(i + 1, w)`` for each window ``w``."""
    return [min(w, T) * (min(w, T) + 1) / 2 + (T - min(w, T)) * min(w, T) for w in windows]
