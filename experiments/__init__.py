"""The project's own studies of PLSH: replication grids, gap curves, gradient fidelity,
sampler studies, the halo simulation, and the experimental samplers they measure.

Not part of the installed package: ``plsh_dist`` never imports this package by itself.
Importing it registers its samplers (``stratified_ramp``, ``stratified_ramp_alt``) with
``plsh_dist.hashing``'s registry, so every study can name them; a run config that names
one sets ``[attention].sampler_module = "experiments.samplers"``. See README.md.
"""

from experiments import samplers  # noqa: F401  registers the lab's samplers
