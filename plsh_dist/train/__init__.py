"""Pretraining: run config, DeepSpeed engine loop, checkpoints, logging, export.

- ``load_config(path, overrides)`` -> ``RunConfig`` (TOML + ``--section.key=value``);
- ``deepspeed_config(...)``: the DeepSpeed dict generated from the run config;
- ``train(cfg)`` -> ``TrainResult`` (collective over all ranks);
- ``export_final`` / ``load_exported``: safetensors weights for evaluation.
"""

from plsh_dist.train.config import RunConfig, load_config, parse_overrides, to_toml, write_resolved
from plsh_dist.train.deepspeed_config import deepspeed_config, resolve_precision
from plsh_dist.train.export import export_final, load_exported
from plsh_dist.train.loop import TrainResult, train, validation_loss

__all__ = [
    "RunConfig", "load_config", "parse_overrides", "to_toml", "write_resolved",
    "deepspeed_config", "resolve_precision",
    "export_final", "load_exported",
    "TrainResult", "train", "validation_loss",
]
