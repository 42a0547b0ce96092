"""A run's record: the resolved config written as ``config.resolved.toml`` and ``config.resolved.json``.

A run writes it into ``out_dir`` once it is accepted (from the ``ResolvedRun``'s ``record``, the
config's tables taken once when the run was resolved: config/resolved.py), into every checkpoint
and into the export. ``read_resolved`` (schema.py) reads the JSON back into a ``RunConfig``: it
parses a table, which is the schema's job, where this module only writes one.
"""

from __future__ import annotations

import json
from pathlib import Path

from plsh_dist.config.schema import RunConfig
from plsh_dist.config_check import toml_literal


def to_toml(cfg: RunConfig | dict) -> str:
    """Serialise the resolved config (or its tables, ``RunConfig.to_dict``) as TOML (None values are left
    out: TOML has no null)."""
    table = cfg.to_dict() if isinstance(cfg, RunConfig) else cfg
    lines = []
    for section, values in table.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_literal(v, strict=True)}" for k, v in values.items() if v is not None]
        lines.append("")
    return "\n".join(lines)


def write_resolved(cfg: RunConfig | dict, directory: str | Path) -> Path:
    """Write ``config.resolved.toml`` and ``config.resolved.json`` of ``cfg`` (a config, or its tables as
    ``RunConfig.to_dict`` gives them: the same two files) into ``directory``."""
    table = cfg.to_dict() if isinstance(cfg, RunConfig) else cfg
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.resolved.toml").write_text(to_toml(table))
    (directory / "config.resolved.json").write_text(json.dumps(table, indent=2, sort_keys=False) + "\n")
    return directory / "config.resolved.toml"
