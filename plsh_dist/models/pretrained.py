"""Continued pretraining: ``[model].init_from`` starts a run from a model saved by transformers.

The source is a model directory (``save_pretrained``), not one of our checkpoints: it is read
on the model side, so the run config (``plsh_dist.config``) can check it when it is loaded.

    [model]
    preset = "qwen3-0.6b"
    init_from = "path/to/a/save_pretrained/dir"     # config.json + model.safetensors

    [attention]
    bias = "plsh"       # e.g. a RoPE Qwen3 continued with PLSH and rope off (the paper's transfer setting)
    rope = false

The directory is checked against ``[model]`` when the config loads (``check_init_from``), read from
safetensors only (``read_pretrained``, ``pretrained_weights``), and trained under ``[attention]``;
``initial_model`` is what the trainer builds. What is checked, and why pickle files are refused:
docs/training.md, "From a checkpoint to an export, and into a new run".
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from plsh_dist.config_check import toml_literal
from plsh_dist.models.build import build_model
from plsh_dist.models.config import AttentionConfig, ModelConfig
from plsh_dist.models.hf_config import check_safetensors_dir, read_safetensors_dir

_FIELD = "[model].init_from"
# ModelConfig fields that no weight depends on (not compared).
_NOT_ARCHITECTURE = ("max_position_embeddings", "init_std")


def read_pretrained(path: str | Path, field: str) -> tuple[dict, ModelConfig]:
    """A transformers directory (``save_pretrained``) -> ``(its config.json, its ModelConfig)``,
    weights present (safetensors only, headers intact) but not read. ``field`` names the setting in errors."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{field} = {str(path)!r} is not a directory; point it at a model saved by transformers "
                         f"(model.save_pretrained(dir): config.json + model.safetensors)")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{field} = {str(path)!r} has no config.json; point it at a directory written by "
                         f"transformers' save_pretrained")
    try:
        hf = json.loads(cfg_file.read_text())
    except ValueError as exc:
        raise ValueError(f"{cfg_file} is not valid JSON ({exc})") from None
    source = ModelConfig.from_hf_config(hf, source=str(cfg_file))
    check_safetensors_dir(path, what=f"{field} =")  # present, safetensors, not truncated
    return hf, source


def pretrained_weights(path: str | Path, field: str) -> dict[str, torch.Tensor]:
    """The safetensors weights of a transformers directory (``read_pretrained``), without the
    rotary ``inv_freq`` buffers older transformers saved (recomputed, never learned)."""
    state = read_safetensors_dir(path, what=f"{field} =")
    return {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}


def model_table_of(source: ModelConfig) -> str:
    """The ``[model]`` TOML table of ``source`` (what to paste into the run config)."""
    lines = ["[model]"] + [f"{k} = {toml_literal(v)}" for k, v in source.to_dict().items()]
    return "\n".join(lines)


def check_init_from(path: str | Path, model_cfg: ModelConfig, attn_cfg: AttentionConfig,
                    tokenizer_path: str | Path | None = None) -> ModelConfig:
    """Check ``path`` against ``[model]`` / ``[attention]`` / ``[tokenizer]`` (module doc) without
    loading the weights -> the source's ``ModelConfig``. ValueError names the field and the fix."""
    path = Path(path)
    hf, source = read_pretrained(path, _FIELD)
    skip = set(_NOT_ARCHITECTURE) | (set() if attn_cfg.rope else {"rope_theta"})
    diffs = [f"{k}: [model] {getattr(model_cfg, k)!r} vs config.json {getattr(source, k)!r}"
             for k in source.to_dict() if k not in skip and getattr(model_cfg, k) != getattr(source, k)]
    if diffs:
        raise ValueError(
            f"{_FIELD} = {str(path)!r}: its architecture differs from [model] ({'; '.join(diffs)}). The weights "
            f"can only be loaded into the same architecture: set [model] to\n{model_table_of(source)}\n"
            f"(and keep [tokenizer] the tokenizer this model was trained with)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if attn_cfg.rope and rope_type not in ("default", None):
        raise ValueError(f"{_FIELD} = {str(path)!r} uses rope_type {rope_type!r}; plsh_dist builds plain rotary "
                         f"embeddings only: continue it with [attention].rope = false, or from a model with "
                         f"default rope")
    _check_tokenizer(path, tokenizer_path)
    return source


def _check_tokenizer(path: Path, tokenizer_path: str | Path | None) -> None:
    own = path / "tokenizer.model"
    run_tok = Path(tokenizer_path) if tokenizer_path is not None else None
    if own.is_file():
        if run_tok is not None and run_tok.is_file():
            if hashlib.sha256(own.read_bytes()).digest() != hashlib.sha256(run_tok.read_bytes()).digest():
                raise ValueError(
                    f"{_FIELD} = {str(path)!r} holds tokenizer.model, which differs from [tokenizer].model_path = "
                    f"{str(run_tok)!r}: the run would feed the model token ids it was not trained on; set "
                    f"[tokenizer].model_path = {str(own)!r}")
        return
    if (path / "tokenizer.json").is_file():
        warnings.warn(f"{_FIELD} = {str(path)!r} has a tokenizer.json, not a SentencePiece tokenizer.model: "
                      f"plsh_dist cannot check that [tokenizer].model_path gives the ids this model was trained "
                      f"on; make sure it does, or the embeddings start from the wrong rows", stacklevel=2)


def load_init_weights(model: torch.nn.Module, path: str | Path, model_cfg: ModelConfig) -> int:
    """Copy the safetensors weights of ``path`` into ``model`` (built from ``model_cfg``) -> tensors loaded.

    ValueError naming the tensors when a shape differs, one is missing (a tied
    LM head may be absent) or the directory has extra ones."""
    path = Path(path)
    state = pretrained_weights(path, _FIELD)
    own = model.state_dict()
    bad = [f"{k}: {tuple(v.shape)} in {path.name}, {tuple(own[k].shape)} in [model]"
           for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        raise ValueError(f"{_FIELD} = {str(path)!r}: tensor shapes differ from [model]: {bad[:4]}"
                         + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
                         + "; set [model] to the source's architecture (config.json)")
    missing = [k for k in own if k not in state and not (model_cfg.tie_embeddings and k == "lm_head.weight")]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ValueError(f"{_FIELD} = {str(path)!r}: weights do not match [model]: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}; is it a {model_cfg.family} causal LM saved by "
                         f"save_pretrained?")
    with torch.no_grad():
        model.load_state_dict(state, strict=False)  # copy_ casts bf16/fp16 files to the model's dtype
    if model_cfg.tie_embeddings:
        model.tie_weights()
    return len(state)


def initial_model(cfg, model_cfg: ModelConfig, attn_cfg: AttentionConfig, runtime, device: torch.device):
    """The model a run starts from: ``build_model`` (init from torch's global RNG)
    and, when ``[model].init_from`` is set, its weights loaded on top (checked again here:
    the directory may have changed since the config was loaded)."""
    model = build_model(model_cfg, attn_cfg, runtime, device=device)
    if cfg.init_from:
        check_init_from(cfg.init_from, model_cfg, attn_cfg, cfg.tokenizer.model_path)
        n = load_init_weights(model, cfg.init_from, model_cfg)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"init_from: {n} tensors from {cfg.init_from}, trained now under bias={attn_cfg.bias} "
                  f"rope={attn_cfg.rope}", flush=True)
    return model
