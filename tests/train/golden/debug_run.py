"""The debug flavor (configs/debug.toml) as the golden-loss tests run it.

Every run prepares its own corpus, tokenizer and token caches under a fresh
``work_dir`` (never the shared ``data_cache/``), so a stale tokenizer there
cannot change the result. The losses then depend only on the code, on
``environment()``: the Python version (the stdlib is the corpus),
sentencepiece (the tokenizer), torch and DeepSpeed (the arithmetic), and on
the CPU code paths torch runs, which the golden runs pin
(``plsh_dist.cpu_paths.PINNED_CPU_ENV``, set by ``pinned_environment``) and
record (each run's ``cpu_paths``).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "debug.toml"
GOLDEN = Path(__file__).with_name("debug_losses.json")
REGENERATE = "python tests/train/golden/regenerate.py"

# Environment keys that change the data or the kernels: a golden file made under
# other values cannot be compared (the test skips and says how to regenerate).
MUST_MATCH = ("python", "torch", "sentencepiece")


def environment() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "sentencepiece": metadata.version("sentencepiece"),
        "deepspeed": metadata.version("deepspeed"),
        "machine": platform.machine(),
    }


def _literal(value) -> str:
    """A TOML literal for a --section.key=value override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def debug_overrides(work_dir: Path, *extra: str) -> list[str]:
    """configs/debug.toml as overrides (spawned runs take no file), with every path in ``work_dir``."""
    table = tomllib.loads(CONFIG.read_text())
    args = [f"--{section}.{key}={_literal(value)}" for section, values in table.items()
            for key, value in values.items()]
    work_dir = Path(work_dir)
    return [*args,
            f"--data.corpus_dir={work_dir / 'corpus'}", f"--data.cache_dir={work_dir / 'cache'}",
            f"--tokenizer.model_path={work_dir / 'tokenizer.model'}", f"--run.out_dir={work_dir / 'out'}",
            *extra]


def prepare_debug_data(work_dir: Path) -> None:
    """Corpus + tokenizer + token caches, built once before the spawned ranks open them."""
    from plsh_dist.config import load_config
    from plsh_dist.data import prepare_data

    cfg = load_config(None, debug_overrides(work_dir))
    prepare_data(cfg.data, cfg.tokenizer)


def run_debug(world: int, work_dir: Path, *layouts: list[str]) -> list[dict]:
    """Train the debug config once per entry of ``layouts`` (extra overrides) in ``world``
    spawned processes; rank 0's results. Outputs go to ``work_dir/w{world}_run{i}``."""
    from tests.train.spawn import run_training

    runs = [debug_overrides(work_dir, *extra, f"--run.out_dir={Path(work_dir) / f'w{world}_run{i}'}")
            for i, extra in enumerate(layouts)]
    return run_training(world, *runs)


@contextlib.contextmanager
def pinned_environment():
    """This process's environment with the pinned CPU code paths, for the ranks it spawns."""
    from plsh_dist.cpu_paths import PINNED_CPU_ENV

    before = {k: os.environ.get(k) for k in PINNED_CPU_ENV}
    os.environ.update(PINNED_CPU_ENV)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# The bf16 debug runs the golden file pins (its "bf16" section): every ZeRO stage with fp32 master
# weights, and the paper's precision (bf16 master weights, ZeRO 1). Without gradient clipping: the
# clip coefficient takes DeepSpeed's square root of the norm, whose last bit follows the CPU model
# (MKL's vector math, results/cpu_paths), and in bf16 one ulp of it moves the losses by up to 6.5e-5
# within 5 steps (the updates round to other bf16 weights); unclipped, it reaches the logged norm only.
_BF16 = ["--deepspeed.precision=bf16", "--optim.grad_clip=0.0"]
BF16_RUNS = {
    "zero0": [*_BF16, "--deepspeed.zero_stage=0"],
    "zero1": [*_BF16, "--deepspeed.zero_stage=1"],
    "zero2": [*_BF16, "--deepspeed.zero_stage=2"],
    "zero3": [*_BF16, "--deepspeed.zero_stage=3"],
    "zero1_bf16_masters": [*_BF16, "--deepspeed.zero_stage=1", "--deepspeed.master_weights=bf16"],
}


def record(run: dict) -> dict:
    """The pinned figures of one run, as the golden file keeps them."""
    return {k: run[k] for k in ("losses", "grad_norms", "val_loss")}


def load_golden() -> dict:
    return json.loads(GOLDEN.read_text())
