"""Truncated ALiBi: exact ALiBi on a window per head, ``w_h = ceil(c sigma_h)``.

The weights it drops are below ``e^-c``; ``c = ln s + 0.58`` costs what PLSH's one-pass
band of s samples costs (``results/truncated_alibi``).
"""

from __future__ import annotations

from plsh_dist.biases.base import _graph_constant, head_scales
from plsh_dist.biases.window import WindowedAlibi
from plsh_dist.ops.alibi import equal_cost_c, truncation_windows


class TruncatedAlibi(WindowedAlibi):
    """Exact ALiBi on ``w_h = ceil(c * sigma_h)`` keys per head (``c``: ``truncate_c``, or
    ``ln(num_samples) + 0.58``)."""

    name = spec = "truncated"
    options = {"s": "num_samples", "num_samples": "num_samples", "c": "truncate_c", "sigma": "sigma",
               "rope": "rope", "chunk": "chunk_size"}
    positional = None
    fields = ("sigma", "rope", "chunk_size", "truncate_c", "num_samples")
    summary = "exact ALiBi on a window per head, w_h = ceil(c * sigma_h)"

    @classmethod
    def check_fields(cls, cfg) -> None:
        if cfg.truncate_c is not None and not cfg.truncate_c > 0:
            raise ValueError(f"attention.truncate_c must be a float > 0 (the window in units of sigma), got "
                             f"{cfg.truncate_c!r}; e.g. truncate_c = 2.66 (= ln 8 + 0.58, PLSH's cost at s = 8)"
                             ", or leave it out for ln(num_samples) + 0.58")

    @classmethod
    def check_spec(cls, overrides, item):
        if "num_samples" in overrides and "truncate_c" in overrides:
            raise ValueError(f"mode {item!r}: give s (c = ln s + 0.58) or c, not both")
        if "num_samples" in overrides:
            overrides["truncate_c"] = None  # c from s, whatever the checkpoint's truncate_c
        return overrides

    @property
    def c(self) -> float:
        """``truncate_c``, or ``ln(num_samples) + 0.58`` when unset."""
        return self.cfg.truncate_c if self.cfg.truncate_c is not None else equal_cost_c(self.cfg.num_samples)

    def key_window(self, num_heads: int) -> int | tuple[int, ...]:
        """An int for a constant sigma, else one window per head."""
        return _truncation_window(self.c, self.cfg.sigma, num_heads)


@_graph_constant
def _truncation_window(c: float, sigma: float | None, num_heads: int):
    sig, _ = head_scales(sigma, num_heads)
    windows = truncation_windows(c, sig).tolist()
    return windows[0] if len(set(windows)) == 1 else tuple(windows)
