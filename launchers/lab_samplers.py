"""The lab's samplers, for the launchers that read a sampler name (imported, never run).

``plsh_dist`` knows only its own samplers (``plsh_dist.hashing``'s registry). The
project's studies (``experiments/``) register theirs when the ``experiments``
package is imported, and their runs name them in configs and checkpoints. The
launchers are where such a name is read from a file, so they import this module
first: it imports ``experiments`` wherever that package imports, i.e. with the
repository root on PYTHONPATH (the Makefile and ``experiments/replicate.py`` set
it). Elsewhere (the package installed alone) nothing is registered, and a name
of the lab's is refused with the registry's message.
"""

try:
    import experiments  # noqa: F401  registers experiments.samplers' samplers
except ModuleNotFoundError as exc:
    if exc.name != "experiments":  # the lab is here but broken: say so, do not hide it
        raise
