"""Checkpoints and exports: what a run writes, how it is kept, and how any of it is read back.

- ``load_model(path)`` -> ``LoadedCheckpoint``: any checkpoint (a run dir, a DeepSpeed tag of
  ZeRO 0-3, an export) -> the model and its settings (``loading.py``);
- ``convert_to_export`` / ``save_export`` / ``export_final``: self-describing safetensors
  exports that transformers' ``from_pretrained`` loads (``export.py``);
- the trainer's side: ``CheckpointManager`` (``manager.py``), the one object the training
  loop talks to (find and check the resume, load, accept, save, export), over
  ``save_checkpoint`` / ``load_checkpoint`` / ``find_resume`` (``tags.py``), the line of
  tags a run keeps and prunes (``line.py``), the checksum
  manifest and durable writes (``manifest.py``), the resume checks (``resume_check.py``),
  safe reading of DeepSpeed's files (``safe_load.py``), ZeRO-3 shards gathered
  (``zero3_weights.py``) and a full disk named (``disk_full.py``).

Evaluation, generation, conversion and the trainer all read checkpoints from here;
nothing here imports the training loop.
"""

from plsh_dist.checkpoint.export import convert_to_export, export_final, export_loaded, save_export
from plsh_dist.checkpoint.loading import LoadedCheckpoint, load_model, locate

__all__ = ["LoadedCheckpoint", "load_model", "locate", "convert_to_export", "export_final", "export_loaded",
           "save_export"]
