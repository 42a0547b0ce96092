"""Pretraining: the DeepSpeed engine loop and what only the loop uses.

- ``train(cfg)`` -> ``TrainResult`` (collective over all ranks);
- ``deepspeed_config(...)``: the DeepSpeed dict generated from the run config;
- ``validation_loss`` / ``exported_validation``: validation loss of the model
  being trained / of an export.

The run config is :mod:`plsh_dist.config` (``load_config``); checkpoints and exports,
written and read, are :mod:`plsh_dist.checkpoint` (``load_model``, ``export_final``).
"""

from plsh_dist.train.deepspeed_config import deepspeed_config
from plsh_dist.train.loop import TrainResult, train
from plsh_dist.train.validation import exported_validation, validation_loss

__all__ = ["TrainResult", "train", "deepspeed_config", "exported_validation", "validation_loss"]
