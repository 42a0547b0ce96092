"""The project's own studies of PLSH: replication grids, gap curves, gradient fidelity,
sampler studies, the halo simulation, and the experimental samplers they measure.

Not part of the installed package: ``plsh_dist`` never imports this package, except
:mod:`experiments.samplers` by name when a config names one of its samplers. See README.md.
"""
