"""Parallel layout and process groups (sequence parallel x data parallel)."""

from plsh_dist.distributed.parallel_dims import ParallelDims, default_backend

__all__ = ["ParallelDims", "default_backend"]
