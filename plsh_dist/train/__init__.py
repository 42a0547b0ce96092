"""Pretraining: run config, DeepSpeed engine loop, checkpoints, logging, export.

- ``load_config(path, overrides)`` -> ``RunConfig`` (TOML + ``--section.key=value``), resolved once;
- ``deepspeed_config(...)``: the DeepSpeed dict generated from the run config;
- ``train(cfg)`` -> ``TrainResult`` (collective over all ranks);
- ``export_final``: safetensors weights (an export) for evaluation and transformers;
- ``load_model(path)``: any checkpoint (run dir, DeepSpeed tag, export) -> model and settings;
- ``validation_loss`` / ``exported_validation``: validation loss of the model
  being trained / of an export.
"""

from plsh_dist.train.config import RunConfig, load_config, parse_overrides, to_toml, write_resolved
from plsh_dist.train.deepspeed_config import deepspeed_config, resolve_precision
from plsh_dist.train.export import export_final
from plsh_dist.train.loader import LoadedCheckpoint, load_model
from plsh_dist.train.loop import TrainResult, train
from plsh_dist.train.validation import exported_validation, validation_loss

__all__ = [
    "RunConfig", "load_config", "parse_overrides", "to_toml", "write_resolved",
    "deepspeed_config", "resolve_precision",
    "export_final", "LoadedCheckpoint", "load_model",
    "TrainResult", "train",
    "exported_validation", "validation_loss",
]
