"""Any checkpoint -> a model and its settings, in one pass with its checks.

    ck = load_model("runs/quickstart")              # a run dir, its final/ export or a step tag
    ck.model, ck.run_config, ck.tokenizer           # eval mode, float32, the trained attention
    load_model(path, dtype=None).model              # in the dtype the weights were saved in (bf16 runs: bf16)

Every reader of trained weights comes here: evaluation, generation, export and conversion
(``launchers/convert_checkpoint.py``) and the validation of an export (a transformers directory a
run starts from, ``[model].init_from``, is read by :mod:`plsh_dist.models.pretrained`). The kinds
of path it takes (export, run directory, DeepSpeed tag of any ZeRO stage), what it checks and in
which order: docs/training.md, "Loading any checkpoint in Python".
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from plsh_dist.checkpoint.line import complete_tags
from plsh_dist.checkpoint.safe_load import safe_torch_load
from plsh_dist.checkpoint.zero3_weights import ZERO3_MODEL_FILE, gather_zero3_weights, is_zero3_tag
from plsh_dist.config.schema import RunConfig, config_from_table, read_resolved
from plsh_dist.data import Tokenizer
from plsh_dist.models import AttentionConfig, AttentionRuntime, ModelConfig, model_with_weights
from plsh_dist.models.hf_config import MODEL_TYPES, check_against_run, read_safetensors_dir, read_section

_DS_MODEL_FILE = "mp_rank_00_model_states.pt"


@dataclass
class LoadedCheckpoint:
    """A trained model ready to use, and what it was trained with."""

    model: torch.nn.Module
    """transformers causal LM in eval mode, our attention registered."""
    run_config: RunConfig
    """The resolved run config saved with the weights."""
    tokenizer: Tokenizer
    path: Path
    """The directory the weights were read from."""
    kind: str
    """``"export"`` or ``"deepspeed"``."""
    run_config_file: Path | None = None
    """The ``config.resolved.json`` ``run_config`` was read from; None when it was rebuilt from an export's
    ``config.json`` (model, attention and seed only: the data and training sections are defaults)."""

    @property
    def model_cfg(self) -> ModelConfig:
        return self.run_config.model

    @property
    def trained_attention(self) -> AttentionConfig:
        """The attention config it was trained under (evaluation modes override fields of it)."""
        return self.run_config.attention


def _is_deepspeed_tag(p: Path) -> bool:
    """A DeepSpeed tag of any ZeRO stage (0-2: one model states file; 3: rank 0's shard of it)."""
    return (p / _DS_MODEL_FILE).is_file() or is_zero3_tag(p)


def _has_safetensors(p: Path) -> bool:
    return (p / "model.safetensors").is_file() or (p / "model.safetensors.index.json").is_file()


def _what_exists(missing: Path) -> str:
    """The fix for a missing checkpoint path: the tags that do exist beside it (a tag pruned by
    [checkpoint].keep_last, a typo), else the kinds of path accepted."""
    tags = complete_tags(missing.parent)
    if tags:
        run = missing.parent.parent
        return (f"the checkpoints in {missing.parent} are {', '.join(tags)} ([checkpoint].keep_last prunes older "
                f"ones); pass one of them, or the run directory {run} (its final/ export or newest checkpoint)")
    return "pass a run directory (out_dir), its final/ export or a checkpoints/step_XXXXXXXX directory"


def locate(path: str | Path) -> tuple[Path, str]:
    """``path`` -> ``(directory holding the weights, kind)``, kind ``"export"`` or ``"deepspeed"``."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"checkpoint {str(p)!r} does not exist; {_what_exists(p)}")
    if _has_safetensors(p):
        return p, "export"
    if _is_deepspeed_tag(p):
        return p, "deepspeed"
    if _has_safetensors(p / "final"):
        return p / "final", "export"
    root = p / "checkpoints"
    if root.is_dir():
        # Published tags only: a ``.partial`` dir is a save a crash interrupted.
        tags = [t for t in complete_tags(root) if _is_deepspeed_tag(root / t)]
        if tags:
            return root / tags[-1], "deepspeed"
    raise ValueError(f"checkpoint {str(p)!r} holds no weights: expected model.safetensors (an export), "
                     f"{_DS_MODEL_FILE} (a DeepSpeed ZeRO 0-2 tag), {ZERO3_MODEL_FILE} (a ZeRO-3 tag) or a run "
                     f"directory containing final/ "
                     f"or checkpoints/")


def _check_export_config(directory: Path, cfg: RunConfig) -> None:
    """An export's config.json must describe the model of its config.resolved.json (module doc)."""
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


def _tokenizer(directory: Path, given: str | Path | None, cfg: RunConfig) -> Tokenizer:
    own = directory / "tokenizer.model"
    if given is None:
        if own.is_file():
            tok = Tokenizer.load(own)
        elif Path(cfg.tokenizer.model_path).is_file():
            tok = Tokenizer.load(cfg.tokenizer.model_path)
        else:
            raise ValueError(f"checkpoint {directory} has no tokenizer.model and its config's tokenizer "
                             f"{cfg.tokenizer.model_path!r} does not exist; pass --tokenizer PATH.model")
    else:
        tok = Tokenizer.load(given)
        if own.is_file() and Tokenizer.load(own).fingerprint != tok.fingerprint:
            raise ValueError(f"tokenizer {str(given)!r} does not match the checkpoint's own "
                             f"{own}: the model was trained with other token ids; drop --tokenizer to use its own")
    cfg.model.check_vocab_covers(tok.vocab_size, str(tok.path), field=f"{directory}: [model].vocab_size",
                                 fix="tokenizer and checkpoint do not match: drop --tokenizer to use the "
                                     "checkpoint's own")
    return tok


def _weights(directory: Path, kind: str) -> dict[str, torch.Tensor]:
    if kind == "export":
        return read_safetensors_dir(directory, what="export")
    if is_zero3_tag(directory):
        return gather_zero3_weights(directory)
    # weights_only: never unpickle arbitrary objects; a damaged file raises an error naming it.
    blob = safe_torch_load(directory / _DS_MODEL_FILE, map_location="cpu",
                           advice="Load another checkpoint or the safetensors export (out_dir/final).")
    state = blob.get("module") if isinstance(blob, dict) else None
    if not state:
        raise ValueError(f"{directory / _DS_MODEL_FILE} holds no module weights; "
                         "load the safetensors export (out_dir/final) instead")
    return state


def saved_dtype(weights: dict[str, torch.Tensor]) -> torch.dtype:
    """The floating dtype the weights were saved in (their first floating tensor's)."""
    return next((w.dtype for w in weights.values() if w.is_floating_point()), torch.float32)


def load_model(path: str | Path, *, tokenizer: str | Path | None = None, attention: AttentionConfig | None = None,
               device: str | torch.device = "cpu", dtype: torch.dtype | None = torch.float32) -> LoadedCheckpoint:
    """Load a checkpoint (module doc) in one pass -> ``LoadedCheckpoint`` (eval mode).

    ``tokenizer``: a ``.model`` file to use instead of the checkpoint's own (it
    must be the same model). ``attention``: build under another attention mode
    (default the trained one; ``set_attention_mode`` switches later too). The
    hash masks are seeded by the run's seed (``AttentionRuntime(run_seed=...)``).
    ``dtype``: the model's; None: the dtype the weights were saved in (a bf16 run's are bf16,
    which exports keep). Raises ValueError for a missing path, a directory without weights, weights
    or a tokenizer that do not fit the saved config.
    """
    directory, kind = locate(path)
    resolved = directory / "config.resolved.json"
    if kind == "export" and not resolved.is_file():
        cfg, resolved = _config_from_export(directory), None
    else:
        cfg = read_resolved(directory)
        if kind == "export":
            _check_export_config(directory, cfg)
    tok = _tokenizer(directory, tokenizer, cfg)
    weights = _weights(directory, kind)
    model = model_with_weights(cfg.model, attention or cfg.attention, AttentionRuntime(run_seed=cfg.run.seed),
                               weights, source=directory, device=device, dtype=dtype or saved_dtype(weights))
    return LoadedCheckpoint(model, cfg, tok, directory, kind, resolved)


def _config_from_export(directory: Path) -> RunConfig:
    """A run config holding what an export's ``config.json`` states (architecture, attention, the
    masks' seed; its ``tokenizer.model``), the rest defaults: an export without config.resolved.json."""
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(f"export {directory} has neither config.resolved.json nor config.json, so the model cannot "
                         f"be rebuilt; copy them from the run's final/ (or re-export with "
                         f"launchers/convert_checkpoint.py)")
    try:
        table = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); re-export with launchers/convert_checkpoint.py") from None
    if table.get("model_type") not in MODEL_TYPES:
        raise ValueError(f"export {directory} has no config.resolved.json and its config.json says model_type "
                         f"{table.get('model_type')!r}, which does not state the attention the weights were trained "
                         f"with; copy config.resolved.json from the run, or re-export with "
                         f"launchers/convert_checkpoint.py")
    attention, seeds = read_section(table, str(path))
    model = ModelConfig.from_hf_config(table, source=str(path))
    return config_from_table({"run": {"seed": seeds["run_seed"]}, "model": model.to_dict(),
                              "attention": attention.to_dict(),
                              "tokenizer": {"model_path": str(directory / "tokenizer.model")}}, source=str(path))
