"""The evaluation token stream: the checkpoint's validation split, files, or a dataset.

Tokenised with the checkpoint's tokenizer through the data package's token
cache (``data_cache/<key>``), so a second evaluation of the same data is free.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from plsh_dist.checkpoint.loading import LoadedCheckpoint
from plsh_dist.data import Source, data_sources, load_token_stream, resolve_files

#: Suffixes that mark --data as local files even when they do not exist (so the error names the path).
_FILE_SUFFIXES = (".txt", ".py", ".md", ".json", ".jsonl", ".parquet", ".gz", ".zst", ".bz2", ".xz")


def _source_of(ck: LoadedCheckpoint, data: str | None, split: str) -> tuple[Source, str]:
    cfg = ck.run_config.data
    if data is None:
        if ck.run_config_file is None:
            raise ValueError(f"{ck.path} has no config.resolved.json, so the data its model was trained on is "
                             f"unknown; pass --data PATH (files/globs) or a datasets name")
        sources = data_sources(cfg)
        if split in sources:
            return sources[split], f"the checkpoint's {split} split"
        if "val" not in sources:
            raise ValueError("the checkpoint's data config has no validation split; pass --data PATH "
                             "(or --split train to score training text)")
        raise ValueError(f"split {split!r} is not one of {sorted(sources)}")
    parts = [p.strip() for p in data.split(",") if p.strip()]
    looks_local = any(Path(p).exists() or any(c in p for c in "*?[") or Path(p).suffix.lower() in _FILE_SUFFIXES
                      for p in parts)
    if looks_local:
        try:
            resolve_files(parts)
        except ValueError as exc:
            raise ValueError(f"--data {data!r}: {exc}") from None
        return Source(files=tuple(parts)), f"files {parts}"
    if len(parts) == 1 and ("/" in data or ":" in data) and not data.startswith((".", "/")):
        name, _, config = data.partition(":")
        return Source(dataset_name=name, dataset_config=config or None, split=split), \
            f"dataset {name}" + (f" ({config})" if config else "") + f" split {split}"
    raise ValueError(f"--data {data!r} is neither an existing file/glob nor a datasets name "
                     "(owner/name[:config]); omit it to use the checkpoint's validation split")


def load_eval_tokens(ck: LoadedCheckpoint, data: str | None, split: str = "val") -> tuple[np.ndarray, str]:
    """``(tokens (N,), description)`` of the evaluation data, tokenised with ``ck.tokenizer``."""
    source, desc = _source_of(ck, data, split)
    # Every document counts for evaluation, even short ones (they are context for the next).
    cfg = dataclasses.replace(ck.run_config.data, min_doc_tokens=0)
    stream = load_token_stream(source, cfg, ck.tokenizer)
    if stream.num_tokens and int(stream.tokens.max()) >= ck.model_cfg.vocab_size:
        raise ValueError(f"evaluation tokens reach id {int(stream.tokens.max())} but the model has "
                         f"{ck.model_cfg.vocab_size} embeddings: tokenizer and checkpoint do not match")
    return np.asarray(stream.tokens), desc
