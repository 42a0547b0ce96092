"""Run configuration: read a TOML file and command-line overrides, check them against the disk.

    cfg = load_config("configs/quickstart.toml", ["--optim.lr=1e-3", "--run.out_dir", "runs/x"])

Precedence: command line ``--section.key=value`` > file > dataclass defaults.
The sections, ``RunConfig`` and the table <-> config steps live in
:mod:`plsh_dist.config.schema`; this module adds what
reads the disk before any work starts: the tokenizer file (its vocabulary
resolves an unset ``[model].vocab_size``), the data paths and
``[model].init_from``.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

from plsh_dist.config.schema import (
    RunConfig,
    apply_overrides,
    build_section,
    config_from_table,
    parse_overrides,
    upgrade_table,
)
from plsh_dist.config.schedule import check_schedule
from plsh_dist.data.config import TokenizerConfig
from plsh_dist.data.dataset import planned_writes
from plsh_dist.data.sources import resolve_files
from plsh_dist.data.tokenizer import Tokenizer
from plsh_dist.models.pretrained import check_init_from
from plsh_dist.writable import why_unwritable


def tokenizer_file_vocab(tok: TokenizerConfig) -> int | None:
    """The vocabulary of the tokenizer file at [tokenizer].model_path, None when there is
    none yet (it will be trained); ValueError when the file is not a SentencePiece model."""
    path = Path(tok.model_path)
    if not path.is_file():
        return None
    try:
        return Tokenizer.load(path).vocab_size
    except RuntimeError as exc:  # SentencePiece's error for a file that is not a model
        raise ValueError(
            f"[tokenizer].model_path = {str(path)!r} is not a SentencePiece model ({exc}); "
            "delete it to train a new one, or point model_path at a valid .model file"
        ) from exc


def check_inputs(cfg: RunConfig) -> None:
    """Checks that read the disk, run by ``load_config`` before any work starts:
    every data path matches a file; [model].init_from fits [model]; the data
    preparation can write where it must (``check_data_outputs``)."""
    named = [(f"[data].{name}", getattr(cfg.data, name)) for name in ("train_files", "val_files")]
    named += [(f"[data].sources[{i}].{name}", table.get(name)) for i, table in enumerate(cfg.data.sources or [])
              for name in ("train_files", "val_files")]
    for field, patterns in named:
        if patterns:
            try:
                resolve_files(patterns)
            except ValueError as exc:
                raise ValueError(f"{field}: {exc}") from exc
    if cfg.init_from is not None:
        check_init_from(cfg.init_from, cfg.model, cfg.attention, cfg.tokenizer.model_path)
    check_data_outputs(cfg)


def check_data_outputs(cfg: RunConfig) -> None:
    """ValueError naming the field when the data preparation would write into a directory it
    cannot write or create: the tokenizer's (a model_path to train), [data].corpus_dir,
    [data].cache_dir (a cache to build). Directories it only reads may be read-only."""
    for write in planned_writes(cfg.data, cfg.tokenizer):
        why = why_unwritable(write.directory)
        if why is not None:
            where = "it" if Path(write.value) == write.directory else repr(str(write.directory))
            raise ValueError(f"{write.setting} = {write.value!r}: {write.what}, but {where} {why}; choose another "
                             f"{write.setting} on a writable disk")


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a TOML run config, apply ``--section.key=value`` overrides, check it all.

    Raises ValueError (naming the field and the fix) before any work starts:
    the values, the learning-rate schedule (``check_schedule``), the tokenizer
    file (its vocabulary resolves [model].vocab_size; a [tokenizer].vocab_size
    set to another size is refused) and the inputs on disk (``check_inputs``).
    The returned config is resolved (:mod:`plsh_dist.config.schema`) and is not
    changed afterwards.
    """
    table: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file {str(path)!r} does not exist; pass --config configs/<run>.toml")
        with path.open("rb") as fh:
            try:
                table = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: invalid TOML: {exc}") from exc
    source = str(path) if path is not None else "command line"
    table = upgrade_table(apply_overrides(table, parse_overrides(overrides or [])), source)
    tok = build_section("tokenizer", TokenizerConfig, table.get("tokenizer", {}))
    file_vocab = tokenizer_file_vocab(tok)
    if file_vocab is not None and "vocab_size" in table.get("tokenizer", {}) and tok.vocab_size != file_vocab:
        raise ValueError(
            f"[tokenizer].vocab_size = {tok.vocab_size}, but the tokenizer file [tokenizer].model_path = "
            f"{tok.model_path!r} has {file_vocab} pieces, and an existing file is used as it is (vocab_size sizes "
            f"only a tokenizer still to be trained); set [tokenizer].vocab_size = {file_vocab} (or leave it out) to "
            f"use this file, or set model_path to a file that does not exist yet to train a {tok.vocab_size}-piece "
            f"tokenizer there")
    cfg = config_from_table(table, tokenizer_vocab=file_vocab or tok.vocab_size)
    check_schedule(cfg.optim, cfg.run.max_steps)
    check_inputs(cfg)
    return cfg
