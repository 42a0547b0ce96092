"""Export final weights as safetensors (Hugging Face layout) and load them back.

``out_dir/final/`` holds ``model.safetensors`` + ``config.json`` (written by
transformers' ``save_pretrained``, loadable by ``from_pretrained``), the
resolved run config and the tokenizer: everything evaluation needs.

``model_from_weights`` is the one way saved weights become a model again:
``load_exported`` (an export) and evaluation's ``load_for_eval`` (an export
or a DeepSpeed tag, ``plsh_dist.eval.checkpoint_loading``) both call it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from plsh_dist.train.config import RunConfig, config_from_table, write_resolved

__all__ = ["export_final", "read_resolved", "model_from_weights", "load_exported"]


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
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        engine.module.save_pretrained(str(directory), state_dict=state, safe_serialization=True)
        write_resolved(cfg, directory)
        if Path(tokenizer_path).is_file():
            shutil.copy2(tokenizer_path, directory / "tokenizer.model")
    if dist.is_initialized():
        dist.barrier()
    return directory


def read_resolved(directory: str | Path) -> RunConfig:
    """The resolved run config saved with weights (``config.resolved.json`` in ``directory``)."""
    cfg_file = Path(directory) / "config.resolved.json"
    if not cfg_file.is_file():
        raise ValueError(f"checkpoint {directory} has no config.resolved.json (written by launchers/pretrain.py); "
                         "cannot rebuild the model without it")
    return config_from_table(json.loads(cfg_file.read_text()))


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
    from plsh_dist.models import AttentionRuntime, build_model

    model_cfg, trained_attn = cfg.model_configs()
    model = build_model(model_cfg, attn_cfg or trained_attn, AttentionRuntime(run_seed=cfg.run.seed),
                        device=device, dtype=dtype)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches: torch raises RuntimeError listing every tensor
        raise ValueError(f"{source}: weights do not fit its config.resolved.json: {exc}") from None
    # save_pretrained drops the LM head when it is tied to the embedding.
    missing = [k for k in missing if not (model_cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{source}: weights do not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    if model_cfg.tie_embeddings:
        model.tie_weights()
    return model.to(dtype=dtype).eval()


def load_exported(directory: str | Path, *, attn_cfg=None, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32):
    """Rebuild an exported model (single process) -> ``(model, RunConfig)``.

    ``attn_cfg``: evaluate under another attention mode (default: the trained one).
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    cfg = read_resolved(directory)
    state = load_file(str(directory / "model.safetensors"), device=str(device))
    return model_from_weights(cfg, state, source=directory, attn_cfg=attn_cfg, device=device, dtype=dtype), cfg
