"""The FlexAttention strategy: PLSH's one pass as a score_mod and a block mask (``strategy.py``), over
the score mods, masks and compiled calls of ``attend.py``."""

from plsh_dist.ops.flex.strategy import FlexOnePass, flex_cpu_inference

__all__ = ["FlexOnePass", "flex_cpu_inference"]
