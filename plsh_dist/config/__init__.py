"""The run config: one TOML file per run, typed sections, checked before any work starts.

- ``load_config(path, overrides)`` -> ``RunConfig`` (TOML + ``--section.key=value``), resolved
  once and checked against the disk (``loading.py``);
- ``RunConfig`` and its sections, ``config_from_table``, ``read_resolved``, the renamed keys
  (``schema.py``); ``write_resolved`` / ``to_toml``: the run's record (``record.py``);
- ``resolve_run(cfg, world, device)`` -> ``ResolvedRun``: the config on this world and device,
  resolved once (precision, master weights, DP x SP layout; ``resolved.py``);
- ``lr_at`` / ``decay_end``: the learning-rate schedule an ``[optim]`` section defines
  (``schedule.py``).

Training, checkpoints, evaluation and the planner all read the config from here.
"""

from plsh_dist.config.loading import check_inputs, load_config, tokenizer_file_vocab
from plsh_dist.config.record import to_toml, write_resolved
from plsh_dist.config.schedule import decay_end, lr_at
from plsh_dist.config.schema import (
                                     RENAMED,
                                     CheckpointSection,
                                     DeepSpeedSection,
                                     LoggingSection,
                                     MemorySection,
                                     OptimSection,
                                     ParallelSection,
                                     RunConfig,
                                     RunSection,
                                     apply_overrides,
                                     build_section,
                                     check_world_size,
                                     config_from_table,
                                     parse_overrides,
                                     read_resolved,
                                     resolve_master_weights, resolve_precision,
                                     upgrade_table,
)

__all__ = [
    "load_config", "check_inputs", "tokenizer_file_vocab",
    "decay_end", "lr_at",
    "RunConfig", "RunSection", "OptimSection", "MemorySection", "DeepSpeedSection", "ParallelSection",
    "CheckpointSection", "LoggingSection", "RENAMED", "config_from_table", "upgrade_table", "build_section",
    "read_resolved", "write_resolved", "to_toml", "check_world_size", "parse_overrides", "apply_overrides",
    "resolve_master_weights",
    "resolve_precision",
]
