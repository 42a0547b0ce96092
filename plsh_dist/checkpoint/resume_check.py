"""A resumed run continues the run its checkpoint belongs to, or refuses to start.

Before the weights load, the fields that define the trained function (``[model]`` except
:data:`MODEL_IMPORT_ONLY`, ``[attention]`` except :data:`COMPUTE_ONLY`, ``[data].document_masking``
and ``seq_len``, ``[run].seed``) are compared with the checkpoint's ``config.resolved.json``, and the
tokenizer by SHA-256 (``check_resume_tokenizer``); then ``check_resume_steps`` refuses a checkpoint
past ``max_steps`` and a schedule that would give a trained step another learning rate. A difference is an error
naming each field, both values and the fix: without it a default changed since (``num_samples``,
``sampler``) would switch the estimator mid-run. The rules in full: docs/training.md, "Resume".
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from plsh_dist.config.resolved import ResolvedRun
from plsh_dist.config.schedule import decay_end, lr_at
from plsh_dist.config.schema import RunConfig, read_resolved

#: [attention] fields that may change on resume: same masks and estimator, another way to compute them
#: (or, ``sampler_module``, another place the sampler's code is imported from: ``sampler`` is compared).
COMPUTE_ONLY = frozenset({"backend", "method", "chunk_size", "sampler_module"})
#: [model] keys that may change on resume: another place the family's code is imported from (``family``
#: is compared).
MODEL_IMPORT_ONLY = frozenset({"family_module"})


def trained_differences(saved: dict, now: dict) -> list[tuple[str, Any, Any]]:
    """``[(field, checkpoint's value, this config's value)]`` of the fields that define the trained model,
    from two configs' TOML tables (``RunConfig.to_dict``: the checkpoint's, and this run's record)."""
    diffs = []
    for section, skip in (("model", MODEL_IMPORT_ONLY), ("attention", COMPUTE_ONLY)):
        old, new = saved[section], now[section]
        for key in sorted((set(old) | set(new)) - skip):
            if old.get(key) != new.get(key):
                diffs.append((f"[{section}].{key}", old.get(key), new.get(key)))
    for section, key in (("data", "document_masking"), ("data", "seq_len"), ("run", "seed")):
        old, new = saved[section][key], now[section][key]
        if old != new:
            diffs.append((f"[{section}].{key}", old, new))
    return diffs


def check_resume_config(run: ResolvedRun, tag_dir: str | Path) -> None:
    """Raise ValueError if ``run`` (its config, compared by its record) would train a different model than
    checkpoint ``tag_dir`` holds.

    A checkpoint without ``config.resolved.json`` is left to the manifest check of
    :func:`plsh_dist.checkpoint.tags.load_checkpoint`, which names the missing file.
    """
    if not (Path(tag_dir) / "config.resolved.json").is_file():
        return
    cfg = run.cfg
    if Path(cfg.tokenizer.model_path).is_file():  # else trained by the data preparation, checked after it
        check_resume_tokenizer(tag_dir, cfg.tokenizer.model_path,
                               hashlib.sha256(Path(cfg.tokenizer.model_path).read_bytes()).hexdigest())
    saved = read_resolved(tag_dir)
    diffs = trained_differences(saved.to_dict(), run.record)
    if not diffs:
        step = _trained_steps(tag_dir)
        if step is not None:
            check_resume_steps(saved, cfg, step, tag_dir)
        return
    lines = "\n".join(f"  {name}: checkpoint {old!r}, this config {new!r}" for name, old, new in diffs)
    raise ValueError(
        f"cannot resume from {tag_dir}: this config trains a different model than the checkpoint holds\n{lines}\n"
        "Set these fields to the checkpoint's values to continue the run as it was trained (a field left out of "
        "the config takes its current default, which may have changed), or start a fresh run "
        "([checkpoint].resume = \"never\" or another [run].out_dir); to continue the weights under other "
        "settings on purpose, export them (launchers/convert_checkpoint.py) and use [model].init_from.")


def check_resume_tokenizer(tag_dir: str | Path, path: str | Path, fingerprint: str) -> None:
    """Raise ValueError if the tokenizer ``path`` (SHA-256 ``fingerprint``, as ``Tokenizer.fingerprint``)
    is not the one checkpoint ``tag_dir`` was trained with (its ``tokenizer.model``; none: nothing to compare)."""
    own = Path(tag_dir) / "tokenizer.model"
    if not own.is_file():
        return
    saved = hashlib.sha256(own.read_bytes()).hexdigest()
    if saved == fingerprint:
        return
    raise ValueError(
        f"cannot resume from {tag_dir}: [tokenizer].model_path = {str(path)!r} is another tokenizer than the one "
        f"the checkpoint was trained with ({own}; SHA-256 {fingerprint[:12]}... vs {saved[:12]}...): the resumed "
        f"steps would train on other token ids. Set --tokenizer.model_path={own} to continue the run; to train "
        "the weights with another tokenizer on purpose, export them (launchers/convert_checkpoint.py) and start "
        "a new run with [model].init_from.")


def _trained_steps(tag_dir: str | Path) -> int | None:
    """The optimizer steps checkpoint ``tag_dir`` has trained (its trainer_state.json), None if unreadable
    (the manifest check of ``load_checkpoint`` names a missing or damaged file)."""
    try:
        return int(json.loads((Path(tag_dir) / "trainer_state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_resume_steps(saved: RunConfig, cfg: RunConfig, step: int, tag_dir: str | Path) -> None:
    """Raise ValueError if ``cfg`` cannot continue checkpoint ``tag_dir`` (of a run configured as
    ``saved``) after its ``step`` trained steps: ``[run].max_steps`` below ``step``, or a learning-rate
    schedule that changes the rate of a step already trained (module doc)."""
    max_steps = cfg.run.max_steps
    if step > max_steps:
        raise ValueError(
            f"cannot resume from {tag_dir}: it has trained {step} steps, more than [run].max_steps = {max_steps}; "
            f"a resume continues a run and cannot take steps back. Set --run.max_steps={step} or more (with "
            f"{step}, nothing is left to train), resume from an earlier checkpoint (--resume=<out_dir>/checkpoints/"
            f"step_XXXXXXXX), or start a new run (--resume never)")
    old_end, new_end = decay_end(saved.optim, saved.run.max_steps), decay_end(cfg.optim, max_steps)
    changed = next((s for s in range(step)
                    if lr_at(s, saved.optim, saved.run.max_steps) != lr_at(s, cfg.optim, max_steps)), None)
    if changed is None:
        return
    fields = [(f"[optim].{name}", getattr(saved.optim, name), getattr(cfg.optim, name))
              for name in ("lr", "min_lr", "warmup_steps") if getattr(saved.optim, name) != getattr(cfg.optim, name)]
    if old_end != new_end:
        fields.append(("end of the decay ([optim].decay_end, or [run].max_steps when decay_end = 0)", old_end,
                       new_end))
    lines = "\n".join(f"  {name}: checkpoint {old!r}, this config {new!r}" for name, old, new in fields)
    fix = ("Set these to the checkpoint's values" if len(fields) > 1 or old_end == new_end else
           f"To train on past step {old_end} at min_lr = {cfg.optim.min_lr:g} (the run's schedule continued), add "
           f"--optim.decay_end={old_end}")
    raise ValueError(
        f"cannot resume from {tag_dir}: this config's learning-rate schedule gives step {changed + 1}, already "
        f"trained, the rate {lr_at(changed, cfg.optim, max_steps):.4g} instead of the run's "
        f"{lr_at(changed, saved.optim, saved.run.max_steps):.4g}; a resume keeps the schedule of the run\n{lines}\n"
        f"{fix}. For a new schedule, start a new run from these weights (export them with "
        f"launchers/convert_checkpoint.py, then set [model].init_from).")
