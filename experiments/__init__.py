"""The project's own studies of PLSH: replication grids, gap curves, gradient fidelity,
sampler studies, the halo simulation, and the experimental samplers they measure.

Not part of the installed package: ``plsh_dist`` never imports this package. Importing
it registers its samplers (``stratified_ramp``, ``stratified_ramp_alt``) with
``plsh_dist.hashing``'s registry, so every study, and every launcher that reads a run of
theirs (``launchers/lab_samplers.py``), can name them. See README.md.
"""

from experiments import samplers  # noqa: F401  registers the lab's samplers
