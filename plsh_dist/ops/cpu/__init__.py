"""The CPU strategies (any device through plain torch ops): the padded per-sample estimator and the
one-pass estimator, with what only they use (their block grid, the one pass's band of block starts
and log counts, also read by decoding)."""

from plsh_dist.ops.cpu.band import block_firsts, log_count_bias
from plsh_dist.ops.cpu.blocks import BlockGrid
from plsh_dist.ops.cpu.onepass import OnePass, onepass_forward, token_bounds
from plsh_dist.ops.cpu.padded import PaddedPerSample, block_bwd, block_fwd

__all__ = ["block_firsts", "log_count_bias", "BlockGrid", "OnePass", "onepass_forward", "token_bounds",
           "PaddedPerSample", "block_bwd", "block_fwd"]
