"""The two files DeepSpeed's multi-node runner reads besides the command line.

``deepspeed --hostfile HOSTFILE ...`` starts one ``deepspeed.launcher.launch``
per host through pdsh over ssh. The remote shell only gets the variables the
runner exports: those starting with PYTHON (PYTHONPATH, ...) and the lines of
its environment file (``.deepspeed_env`` in the home or working directory, or
the path in ``DS_ENV_FILE``). Everything else a rank needs (DS_ACCELERATOR on
CPU, offline Hugging Face, thread counts, fault injection in tests) goes in
that file.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["RANK_ENV", "write_hostfile", "write_deepspeed_env"]

# What every CPU rank needs on a remote host (launcher_env's settings, minus what the runner exports itself).
RANK_ENV = {"DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PLSH_PROGRESS": "0"}


def write_hostfile(path: Path, names: list[str], slots: int) -> Path:
    """``<name> slots=<slots>`` per host; ranks are numbered host by host in this order."""
    Path(path).write_text("".join(f"{name} slots={slots}\n" for name in names))
    return Path(path)


def write_deepspeed_env(path: Path, env: dict[str, str]) -> Path:
    """``KEY=VALUE`` lines; the runner prepends ``export KEY=VALUE;`` to each host's command."""
    for key, value in env.items():
        if "\n" in value or "=" in key:
            raise ValueError(f"{key}={value!r}: one KEY=VALUE per line")
    Path(path).write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return Path(path)
