"""Attention operators: positional LSH, exact ALiBi baselines, dense references."""
