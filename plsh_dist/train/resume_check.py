"""A resumed run continues the model its checkpoint trained, or refuses to start.

Every checkpoint holds the run config as resolved at launch
(``config.resolved.json``). Before the weights load, the fields that define
the trained function are compared with the config resuming it: the whole
``[model]`` table, ``[attention]`` except the fields that only choose how the
same estimator is computed (:data:`COMPUTE_ONLY`), ``[data].document_masking``
and ``[run].seed`` (it seeds the hash masks). A difference is an error naming
each field, both values and the fix. Without it, a config that leaves a field
to its default would silently switch estimator mid-run when a default changes
(for instance ``[attention].num_samples`` or ``sampler``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plsh_dist.train.run_config import RunConfig, read_resolved

__all__ = ["COMPUTE_ONLY", "check_resume_config", "trained_differences"]

#: [attention] fields that may change on resume: same masks and estimator, another way to compute them.
COMPUTE_ONLY = frozenset({"backend", "method", "chunk_size"})


def trained_differences(saved: RunConfig, cfg: RunConfig) -> list[tuple[str, Any, Any]]:
    """``[(field, checkpoint's value, this config's value)]`` of the fields that define the trained model."""
    diffs = []
    saved_table, table = saved.to_dict(), cfg.to_dict()
    for section, skip in (("model", frozenset()), ("attention", COMPUTE_ONLY)):
        old, new = saved_table[section], table[section]
        for key in sorted((set(old) | set(new)) - skip):
            if old.get(key) != new.get(key):
                diffs.append((f"[{section}].{key}", old.get(key), new.get(key)))
    for label, old, new in (("[data].document_masking", saved.data.document_masking, cfg.data.document_masking),
                            ("[run].seed", saved.run.seed, cfg.run.seed)):
        if old != new:
            diffs.append((label, old, new))
    return diffs


def check_resume_config(cfg: RunConfig, tag_dir: str | Path) -> None:
    """Raise ValueError if ``cfg`` would train a different model than checkpoint ``tag_dir`` holds.

    A checkpoint without ``config.resolved.json`` is left to the manifest check of
    :func:`plsh_dist.train.checkpoint.load_checkpoint`, which names the missing file.
    """
    if not (Path(tag_dir) / "config.resolved.json").is_file():
        return
    saved = read_resolved(tag_dir)
    diffs = trained_differences(saved, cfg)
    if not diffs:
        return
    lines = "\n".join(f"  {name}: checkpoint {old!r}, this config {new!r}" for name, old, new in diffs)
    raise ValueError(
        f"cannot resume from {tag_dir}: this config trains a different model than the checkpoint holds\n{lines}\n"
        "Set these fields to the checkpoint's values to continue the run as it was trained (a field left out of "
        "the config takes its current default, which may have changed), or start a fresh run "
        "([checkpoint].resume = \"never\" or another [run].out_dir); to continue the weights under other "
        "settings on purpose, export them (launchers/convert_checkpoint.py) and use [model].init_from.")
