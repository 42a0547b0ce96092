"""plsh_dist: distributed long-context pretraining with Positional LSH attention."""

from plsh_dist import quiet as _quiet

__version__ = "0.1.0"

_quiet.install()  # a few third-party notices, each by its exact message (quiet.py)
