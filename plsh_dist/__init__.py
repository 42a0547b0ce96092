"""plsh_dist: distributed long-context pretraining with Positional LSH attention."""

__version__ = "0.1.0"
