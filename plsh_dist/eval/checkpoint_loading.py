"""Load trained weights for evaluation, from any of the places training writes them.

Accepted ``checkpoint`` paths:

- an exported directory (``out_dir/final``): ``model.safetensors`` (or a
  sharded ``model.safetensors.index.json``) + ``config.resolved.json`` (+
  ``tokenizer.model``); its ``config.json``, when it is plsh_dist's own type
  (``qwen3_plsh`` ...), must describe the same model (attention, seed,
  architecture) or loading stops naming both files; an older export whose
  ``config.json`` says plain ``qwen3`` loads with a warning (plain
  transformers would rebuild it with RoPE/SDPA): ``convert_to_export`` /
  ``launchers/convert_checkpoint.py`` rewrite it;
- a run directory (``out_dir``): its ``final/`` if present, else its newest
  complete DeepSpeed checkpoint;
- a DeepSpeed tag directory (``out_dir/checkpoints/step_00000100``), ZeRO
  stage 0-2 (``mp_rank_00_model_states.pt``). ZeRO-3 shards are not gathered
  here: export safetensors (``[checkpoint].export_safetensors``) instead.

The tokenizer is the checkpoint's own ``tokenizer.model`` unless one is
given; a given one must be the same model (same fingerprint), and either way
its vocabulary must fit the model's embedding.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from plsh_dist.data import Tokenizer
from plsh_dist.models import AttentionConfig, ModelConfig
from plsh_dist.train.checkpoint import complete_tags
from plsh_dist.train.checkpoint_io import safe_torch_load
from plsh_dist.train.config import RunConfig, read_resolved
from plsh_dist.train.export import model_from_weights, save_export

__all__ = ["LoadedCheckpoint", "resolve_checkpoint", "load_for_eval", "convert_to_export"]

_DS_MODEL_FILE = "mp_rank_00_model_states.pt"


@dataclass
class LoadedCheckpoint:
    """A model ready to evaluate, and what it was trained with."""

    model: torch.nn.Module
    """transformers causal LM in eval mode, float32, our attention registered."""
    run_config: RunConfig
    """The resolved run config saved with the weights."""
    model_cfg: ModelConfig
    trained_attention: AttentionConfig
    """The attention config it was trained under (modes override fields of it)."""
    tokenizer: Tokenizer
    path: Path
    """The directory the weights were read from."""


def _has_safetensors(p: Path) -> bool:
    return (p / "model.safetensors").is_file() or (p / "model.safetensors.index.json").is_file()


def resolve_checkpoint(path: str | Path) -> tuple[Path, str]:
    """``path`` -> ``(directory, kind)`` with kind ``"export"`` or ``"deepspeed"``."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"checkpoint {str(p)!r} does not exist; pass a run directory (out_dir), its final/ "
                         f"export or a checkpoints/step_XXXXXXXX directory")
    if _has_safetensors(p):
        return p, "export"
    if (p / _DS_MODEL_FILE).is_file():
        return p, "deepspeed"
    if _has_safetensors(p / "final"):
        return p / "final", "export"
    root = p / "checkpoints"
    if root.is_dir():
        # Published tags only: a ``.partial`` dir is a save a crash interrupted.
        tags = [t for t in complete_tags(root) if (root / t / _DS_MODEL_FILE).is_file()]
        if tags:
            return root / tags[-1], "deepspeed"
    raise ValueError(f"checkpoint {str(p)!r} holds no weights: expected model.safetensors (an export), "
                     f"{_DS_MODEL_FILE} (a DeepSpeed ZeRO 0-2 tag) or a run directory containing final/ "
                     f"or checkpoints/")


def _check_export_config(directory: Path, cfg: RunConfig) -> None:
    """An export's config.json must describe the model of its config.resolved.json (module doc)."""
    from plsh_dist.models.hf_config import MODEL_TYPES, check_against_run

    path = directory / "config.json"
    if not path.is_file():
        return
    try:
        table = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); re-export with launchers/convert_checkpoint.py") from None
    if table.get("model_type") in MODEL_TYPES:
        check_against_run(table, cfg.to_dict(), directory)
    else:
        warnings.warn(
            f"{path} says model_type {table.get('model_type')!r}: plain transformers would load this export as a "
            f"different model (no ALiBi/PLSH, rope on). Rewrite it once: python launchers/convert_checkpoint.py "
            f"--checkpoint {directory} --out <new dir>", stacklevel=3)


def _load_tokenizer(directory: Path, tokenizer_path: str | Path | None, cfg: RunConfig) -> Tokenizer:
    own = directory / "tokenizer.model"
    if tokenizer_path is None:
        if own.is_file():
            return Tokenizer.load(own)
        if Path(cfg.tokenizer.model_path).is_file():
            return Tokenizer.load(cfg.tokenizer.model_path)
        raise ValueError(f"checkpoint {directory} has no tokenizer.model and its config's tokenizer "
                         f"{cfg.tokenizer.model_path!r} does not exist; pass --tokenizer PATH.model")
    tok = Tokenizer.load(tokenizer_path)
    if own.is_file() and Tokenizer.load(own).fingerprint != tok.fingerprint:
        raise ValueError(f"tokenizer {str(tokenizer_path)!r} does not match the checkpoint's own "
                         f"{own}: the model was trained with other token ids; drop --tokenizer to use its own")
    return tok


def _state_dict(directory: Path, kind: str) -> dict[str, torch.Tensor]:
    if kind == "export":
        from plsh_dist.models.hf_config import read_safetensors_dir

        return read_safetensors_dir(directory, what="export")
    # weights_only: never unpickle arbitrary objects; a damaged file raises an error naming it.
    blob = safe_torch_load(directory / _DS_MODEL_FILE, map_location="cpu",
                           advice="Evaluate another checkpoint or the safetensors export (out_dir/final).")
    state = blob.get("module") if isinstance(blob, dict) else None
    if not state:
        raise ValueError(f"{directory / _DS_MODEL_FILE} holds no module weights (a ZeRO-3 checkpoint?); "
                         "evaluate the safetensors export (out_dir/final) instead")
    return state


def load_for_eval(path: str | Path, tokenizer_path: str | Path | None = None) -> LoadedCheckpoint:
    """Load a checkpoint (see module doc) on CPU in float32 for evaluation
    (``plsh_dist.train.export.model_from_weights`` rebuilds the model).

    Raises ValueError for a missing path, a directory without weights, weights
    that do not fit the saved config, or a tokenizer that does not match.
    """
    directory, kind = resolve_checkpoint(path)
    cfg = read_resolved(directory)
    if kind == "export":
        _check_export_config(directory, cfg)
    tokenizer = _load_tokenizer(directory, tokenizer_path, cfg)
    cfg.model.check_vocab_covers(tokenizer.vocab_size, str(tokenizer.path), field=f"{directory}: [model].vocab_size",
                                 fix="tokenizer and checkpoint do not match: drop --tokenizer to use the "
                                     "checkpoint's own")
    model = model_from_weights(cfg, _state_dict(directory, kind), source=directory)
    return LoadedCheckpoint(model, cfg, cfg.model, cfg.attention, tokenizer, directory)


def convert_to_export(path: str | Path, out_dir: str | Path, tokenizer_path: str | Path | None = None) -> Path:
    """Write the self-describing export (``plsh_dist.train.export.save_export``) of any
    checkpoint ``load_for_eval`` reads (a DeepSpeed ZeRO 0-2 tag, a run directory,
    an older export) into ``out_dir``, which must be a new or empty directory."""
    out = Path(out_dir)
    ck = load_for_eval(path, tokenizer_path)
    if out.exists() and (out.resolve() == ck.path.resolve() or any(out.iterdir())):
        raise ValueError(f"--out {out} is the checkpoint itself or not empty; write the export to a new directory")
    return save_export(ck.model, ck.run_config, ck.tokenizer.path, out)
