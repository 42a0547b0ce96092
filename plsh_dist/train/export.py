"""Export final weights as safetensors (Hugging Face layout) and load them back.

``out_dir/final/`` holds ``model.safetensors`` + ``config.json`` (written by
transformers' ``save_pretrained``), the resolved run config and the tokenizer
(``tokenizer.model`` + ``tokenizer_config.json``): everything evaluation needs,
and self-describing: ``config.json`` has plsh_dist's model type
(``qwen3_plsh`` ...) and a ``plsh_dist`` section with the trained attention
and the hash-seed rule (:mod:`plsh_dist.models.hf_config`), so after
``import plsh_dist.models``::

    AutoModelForCausalLM.from_pretrained(out_dir / "final")   # == model_from_weights + training's eval
    AutoTokenizer.from_pretrained(out_dir / "final")          # the run's SentencePiece ids

and, with no import, the same with ``trust_remote_code=True``: the export
carries transformers' ``auto_map`` and three small modules that name the
installed package's classes (:mod:`plsh_dist.models.remote_code`). Without
either, transformers asks for ``trust_remote_code=True`` instead of loading
another model. ``save_export`` writes that layout (``export_final`` after training,
``launchers/convert_checkpoint.py`` from any DeepSpeed tag or older export).

``model_from_weights`` is the one way saved weights become a model again
(over :func:`plsh_dist.models.build.model_with_weights`): ``load_exported``
(an export) and evaluation's ``load_for_eval`` (an export or a DeepSpeed tag,
``plsh_dist.eval.checkpoint_loading``) both call it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from plsh_dist.train.config import RunConfig, read_resolved, write_resolved

__all__ = ["export_final", "save_export", "model_from_weights", "load_exported"]


def _full_state_dict(engine) -> dict[str, torch.Tensor] | None:
    """Full (unsharded) weights on rank 0, None elsewhere. Collective under ZeRO-3."""
    if engine.zero_optimization_partition_weights():
        # Gathers each partitioned parameter; needs stage3_gather_16bit_weights_on_model_save.
        return engine._zero3_consolidated_16bit_state_dict()
    rank = dist.get_rank() if dist.is_initialized() else 0
    return engine.module.state_dict() if rank == 0 else None


def export_final(engine, cfg: RunConfig, tokenizer_path: str | Path, directory: str | Path) -> Path:
    """Collective: write the trained weights to ``directory`` (rank 0 writes)."""
    directory = Path(directory)
    state = _full_state_dict(engine)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        save_export(engine.module, cfg, tokenizer_path, directory, state_dict=state)
    if dist.is_initialized():
        dist.barrier()
    return directory


def save_export(model, cfg: RunConfig, tokenizer_path: str | Path | None, directory: str | Path, *,
                state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write the self-describing export of ``model`` (module doc) into ``directory`` (one process).

    ``model``: built by ``build_model`` (a registered plsh_dist class); its
    config's ``plsh_dist`` section is set to ``cfg``'s trained attention and
    run seed, whatever mode it was last switched to. ``state_dict``: the
    weights to write (default the model's own; ZeRO-3 passes the gathered ones).
    ``tokenizer_path``: the run's ``.model`` file (copied with its
    ``tokenizer_config.json``); None or missing: no tokenizer is written.
    """
    from plsh_dist.data import EOS_ID, PAD_ID
    from plsh_dist.data.tokenizer import BOS_ID
    from plsh_dist.models.hf_config import PLSH_CONFIG_TYPES, describe
    from plsh_dist.models.hf_tokenizer import save_tokenizer
    from plsh_dist.models.remote_code import add_tokenizer_auto_map, auto_map, write_remote_code

    if not isinstance(model.config, PLSH_CONFIG_TYPES):
        raise ValueError(f"{type(model).__name__} was not built by plsh_dist.models.build_model: its config.json "
                         "would not name the attention; rebuild it with model_from_weights")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    describe(model.config, cfg.attention, cfg.run.seed)
    gen = model.generation_config
    gen.use_cache = True  # HF generate() decodes with plsh_dist attention's KV cache
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = BOS_ID, EOS_ID, PAD_ID
    state = state_dict if state_dict is not None else model.state_dict()
    state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    # from_pretrained(directory, trust_remote_code=True) without importing plsh_dist (remote_code.py)
    model.config.auto_map = auto_map(type(model.config).__name__.removesuffix("PlshConfig"))
    model.save_pretrained(str(directory), state_dict=state, safe_serialization=True)
    write_remote_code(directory)
    write_resolved(cfg, directory)
    if tokenizer_path is not None and Path(tokenizer_path).is_file():
        if Path(tokenizer_path).resolve() != (directory / "tokenizer.model").resolve():
            shutil.copy2(tokenizer_path, directory / "tokenizer.model")
        save_tokenizer(directory / "tokenizer.model", directory)
        add_tokenizer_auto_map(directory)
    return directory


def model_from_weights(cfg: RunConfig, state: dict[str, torch.Tensor], *, source: str | Path, attn_cfg=None,
                       device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """``cfg``'s model (our attention, ``AttentionRuntime(run_seed=cfg.run.seed)``) holding the
    weights ``state``, in eval mode: the one checkpoint -> model step of ``load_exported``
    and of evaluation (``plsh_dist.eval.checkpoint_loading``).

    ``state`` may lack ``lm_head.weight`` when the LM head is tied to the
    embedding (``save_pretrained`` drops it). ``attn_cfg``: build under another
    attention mode (default: the trained one). ``source`` names the weights in
    errors. Raises ValueError when the weights do not fit ``cfg``.
    """
    from plsh_dist.models import AttentionRuntime, model_with_weights

    return model_with_weights(cfg.model, attn_cfg or cfg.attention, AttentionRuntime(run_seed=cfg.run.seed), state,
                              source=source, device=device, dtype=dtype)


def load_exported(directory: str | Path, *, attn_cfg=None, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32):
    """Rebuild an exported model (single process) -> ``(model, RunConfig)``.

    ``attn_cfg``: evaluate under another attention mode (default: the trained one).
    """
    from plsh_dist.models.hf_config import read_safetensors_dir

    directory = Path(directory)
    cfg = read_resolved(directory)
    state = read_safetensors_dir(directory, what="export")
    return model_from_weights(cfg, state, source=directory, attn_cfg=attn_cfg, device=device, dtype=dtype), cfg
