"""Per-rank memory, FLOPs and sequence-parallel traffic of a run, before running it.

- ``plan_run(cfg, world_size=, device=)`` -> ``Plan`` (``estimate.py``);
- ``format_plan`` / ``plan_table`` / ``fit_line`` (``report.py``): what ``launchers/plan.py`` prints;
- the measured peak of a real CPU run, to check the estimate against, is the trainer's:
  ``plsh_dist.train.peak_measure.measure_cpu_peak(cfg)``.

One file per part: model shapes (``shapes.py``), DeepSpeed states per ZeRO
stage (``zero_states.py``), activations and the loss (``activations.py``),
attention pairs / FLOPs / workspace (``attention_cost.py``), SP halo traffic
from the real hash (``halo_traffic.py``).
"""

from plsh_dist.plan.estimate import FlopsPlan, MemoryPlan, Plan, model_flops, plan_run

__all__ = ["Plan", "MemoryPlan", "FlopsPlan", "model_flops", "plan_run"]
