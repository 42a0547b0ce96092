"""Exports: trained weights as safetensors (Hugging Face layout), self-describing.

``out_dir/final/`` holds ``model.safetensors`` + ``config.json`` (written by
transformers' ``save_pretrained``), the resolved run config and the tokenizer
(``tokenizer.model`` + ``tokenizer_config.json``): everything evaluation needs,
and self-describing: ``config.json`` has plsh_dist's model type
(``qwen3_plsh`` ...) and a ``plsh_dist`` section with the trained attention
and the hash-seed rule (:mod:`plsh_dist.models.hf_config`), so after
``import plsh_dist.models``::

    AutoModelForCausalLM.from_pretrained(out_dir / "final")   # == plsh_dist.checkpoint.loading.load_model
    AutoTokenizer.from_pretrained(out_dir / "final")          # the run's SentencePiece ids

and, with no import, the same with ``trust_remote_code=True``, also where plsh_dist is not
installed: the export carries transformers' ``auto_map``, three entry modules and the
package's modelling code bundled with them (:mod:`plsh_dist.models.remote_code`), written by
the model's and tokenizer's own ``save_pretrained``, so a re-saved export carries them
too. ``README.md`` is the Hub's model card (:mod:`plsh_dist.checkpoint.model_card`): the
directory can be published as it is. Without either, transformers asks for ``trust_remote_code=True`` instead of loading
another model. ``save_export`` writes that layout (``export_final`` after training,
``convert_to_export`` / ``launchers/convert_checkpoint.py`` from any checkpoint
the loader reads: :mod:`plsh_dist.checkpoint.loading`, which also reads exports back).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from plsh_dist.checkpoint.loading import LoadedCheckpoint, load_model
from plsh_dist.checkpoint.model_card import model_card
from plsh_dist.config.record import write_resolved
from plsh_dist.config.schema import RunConfig
from plsh_dist.data import EOS_ID, PAD_ID
from plsh_dist.data.tokenizer import BOS_ID
from plsh_dist.models.hf_config import describe, plsh_config_types
from plsh_dist.models.hf_tokenizer import save_tokenizer


def _full_state_dict(engine) -> dict[str, torch.Tensor] | None:
    """Full (unsharded) weights on rank 0, None elsewhere. Collective under ZeRO-3."""
    if engine.zero_optimization_partition_weights():
        # Gathers each partitioned parameter; needs stage3_gather_16bit_weights_on_model_save.
        return engine._zero3_consolidated_16bit_state_dict()
    rank = dist.get_rank() if dist.is_initialized() else 0
    return engine.module.state_dict() if rank == 0 else None


def export_final(engine, cfg: RunConfig, tokenizer_path: str | Path, directory: str | Path,
                 training: dict | None = None) -> Path:
    """Collective: write the trained weights to ``directory`` (rank 0 writes); ``training``: the
    run's steps, tokens seen and evaluation, for the model card (:func:`save_export`)."""
    directory = Path(directory)
    state = _full_state_dict(engine)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        save_export(engine.module, cfg, tokenizer_path, directory, state_dict=state, training=training)
    if dist.is_initialized():
        dist.barrier()
    return directory


def save_export(model, cfg: RunConfig, tokenizer_path: str | Path | None, directory: str | Path, *,
                state_dict: dict[str, torch.Tensor] | None = None, training: dict | None = None) -> Path:
    """Write the self-describing export of ``model`` (module doc) into ``directory`` (one process).

    ``model``: built by ``build_model`` (a registered plsh_dist class); its
    config's ``plsh_dist`` section is set to ``cfg``'s trained attention and
    run seed, whatever mode it was last switched to. ``state_dict``: the
    weights to write (default the model's own; ZeRO-3 passes the gathered ones).
    ``tokenizer_path``: the run's ``.model`` file (copied with its
    ``tokenizer_config.json``); None or missing: no tokenizer is written. ``README.md`` is the
    Hub's model card (:mod:`plsh_dist.checkpoint.model_card`; ``training``: the run's ``steps``,
    ``tokens_seen`` and ``evaluation``, None when unknown).
    """
    if not isinstance(model.config, plsh_config_types()):
        raise ValueError(f"{type(model).__name__} was not built by plsh_dist.models.build_model: its config.json "
                         "would not name the attention; load it with plsh_dist.checkpoint.loading.load_model")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    describe(model.config, cfg.attention, cfg.run.seed)
    # config.json and generation_config.json give the same ids and cache setting: HF generate()
    # decodes with plsh_dist attention's KV cache, and tools reading config.json alone see the ids.
    for settings in (model.config, model.generation_config):
        settings.bos_token_id, settings.eos_token_id, settings.pad_token_id = BOS_ID, EOS_ID, PAD_ID
    model.generation_config.use_cache = True
    training_use_cache, model.config.use_cache = model.config.use_cache, True
    state = state_dict if state_dict is not None else model.state_dict()
    state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    try:
        # also writes auto_map and the remote-code modules (remote_code.py): from_pretrained(directory,
        # trust_remote_code=True) without importing plsh_dist; save_tokenizer does the tokenizer's
        model.save_pretrained(str(directory), state_dict=state, safe_serialization=True)
    finally:
        model.config.use_cache = training_use_cache  # the live model keeps training's setting (no cache)
    write_resolved(cfg, directory)
    (directory / "README.md").write_text(model_card(cfg, model.config, training))
    if tokenizer_path is not None and Path(tokenizer_path).is_file():
        if Path(tokenizer_path).resolve() != (directory / "tokenizer.model").resolve():
            shutil.copy2(tokenizer_path, directory / "tokenizer.model")
        save_tokenizer(directory / "tokenizer.model", directory)
    return directory


def export_loaded(ck: LoadedCheckpoint, out_dir: str | Path) -> Path:
    """Write the export of ``ck`` (``load_model``'s checkpoint) into ``out_dir``, in its model's
    dtype, which must be a new or empty directory other than the checkpoint's own."""
    out = Path(out_dir)
    if ck.run_config_file is None:
        raise ValueError(f"{ck.path} has no config.resolved.json: a new export would record default training "
                         f"settings as the run's; its config.json already loads with transformers (and "
                         f"plsh_dist's loader) as it is")
    if out.exists() and (out.resolve() == ck.path.resolve() or any(out.iterdir())):
        raise ValueError(f"--out {out} is the checkpoint itself or not empty; write the export to a new directory")
    return save_export(ck.model, ck.run_config, ck.tokenizer.path, out)


def convert_to_export(path: str | Path, out_dir: str | Path, tokenizer: str | Path | None = None) -> Path:
    """Write the self-describing export of any checkpoint the loader reads (a DeepSpeed
    ZeRO 0-3 tag, a run directory, an older export) into ``out_dir`` (``export_loaded``),
    in the dtype its weights were saved in."""
    return export_loaded(load_model(path, tokenizer=tokenizer, dtype=None), out_dir)
