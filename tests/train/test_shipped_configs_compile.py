"""Every shipped config trains compiled (``[run].compile``) as it trains eagerly.

Each ``configs/*.toml`` runs at a tiny scale on CPU: its model and length shrunk (the tiny preset
of ``tests/train/conftest.py``, ``seq_len`` 64, or 16 tokens per rank at SP = 8, 4 steps, the small
stdlib corpus, no checkpoint, export or tensorboard), everything else as the file has it: the
attention fields (bias, rope, samples), ``sp_size`` (world = sp_size, dp = 1: 8 processes for the
128k config), activation checkpointing and its mode, document masking, the ZeRO stage, gradient
accumulation (at most 2) and the precision (``"auto"`` is fp32 on a CPU; ``debug.toml`` says fp32).
Eager, ``aot_eager`` and ``inductor`` runs of a config then give the same losses, gradient norms and
validation loss. ``[run].compile`` with ZeRO-3 is refused (``RunConfig.validate``: DeepSpeed's
parameter hooks break the layer's graph), so the 128k config (ZeRO-3) is checked refused and then
run at ZeRO-2, its refusal's way out. All of it is in ``make test-slow`` (every config with both
backends, and bf16: 7.6 min, the inductor cache cold at the start); ``make test`` trains a compiled
2-rank SP run (tests/train/test_compile_training.py).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from plsh_dist.config import load_config, resolve_precision
from tests.tolerances import FP32
from tests.train.conftest import base_overrides
from tests.train.spawn import run_training
from tests.train.test_compile_training import COMPILED_REL

#: Relative tolerance of a compiled run's losses, gradient norms and validation loss against eager's.
#: aot_eager runs the ops eager runs (COMPILED_REL's reasons); measured (torch 2.13, CPU, every config):
#: to the bit at SP = 1 and 2, within 2e-8 at SP = 4 and 8. inductor generates its own C++ kernels for
#: what lies between the matmuls and the attention op (norms, rotary, SiLU, residuals): the same fp32
#: arithmetic in another order, vectorised, with fused multiply-adds, about 1 ulp (6e-8) per value,
#: which 4 steps at lr 3e-3 carry into the weights; measured at most 2.9e-6 (a gradient norm of the
#: ALiBi config; losses 1.9e-7, validation losses 8e-8). Its tolerance is the fp32 paths' rtol
#: (tests/tolerances.py: 2e-5, 7x the largest measured), room for other CPUs' vector widths.
REL = {"aot_eager": COMPILED_REL, "inductor": FP32["rtol"]}
#: The same in bf16 (DeepSpeed's CPU accelerator, fp32 master weights). aot_eager runs eager's bf16 ops
#: (measured: to the bit). inductor keeps a fused kernel's intermediates in fp32 and rounds its output
#: to bf16 once, where eager rounds every op's output: the two differ by about one bf16 rounding
#: (2^-8 = 3.9e-3 relative) per value; measured at most 1.6e-3 (a gradient norm; losses 7.7e-5). The
#: tolerance is that one rounding.
REL_BF16 = {"aot_eager": COMPILED_REL, "inductor": 2.0 ** -8}

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))
CONFIG_32K = next(p for p in CONFIGS if p.stem == "qwen3_0.6b_32k_plsh_sp4")

#: What the tiny run replaces (its data and tokenizer come from the ``tiny_data`` fixture).
_DROPPED = {"tokenizer": None, "data": {"corpus_dir", "corpus_max_files", "corpus_val_fraction", "cache_dir",
                                        "dataset_name", "dataset_config"}}


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def config_overrides(path: Path) -> list[str]:
    """``path``'s own settings as ``--section.key=value`` overrides, less its data and tokenizer."""
    with path.open("rb") as fh:
        table = tomllib.load(fh)
    out = []
    for section, fields in table.items():
        if section in _DROPPED and _DROPPED[section] is None:
            continue
        for key, value in fields.items():
            if key not in (_DROPPED.get(section) or ()):
                out.append(f"--{section}.{key}={_literal(value)}")
    return out


def shrunk(path: Path, tiny_data, out_dir: Path, *extra: str) -> list[str]:
    """``path`` at a tiny scale on CPU, its layout kept (module docstring)."""
    cfg = load_config(path)
    sp = cfg.parallel.sp_size
    return [*config_overrides(path), *base_overrides(tiny_data, out_dir),
            f"--data.seq_len={max(64, 16 * sp)}",  # 16 tokens or more per SP rank
            f"--data.micro_batch_size={min(cfg.data.micro_batch_size, 2)}",
            f"--optim.grad_accum_steps={min(cfg.optim.grad_accum_steps, 2)}",
            "--checkpoint.every_steps=0", "--logging.eval_every=0", "--logging.every_steps=1", *extra]


def _kept(path: Path, overrides: list[str]):
    """The fields of ``path`` the tiny run keeps, as the file gives them and as the run will use them."""
    def layout(cfg):
        return {"attention": cfg.attention, "sp_size": cfg.parallel.sp_size, "memory": (
                    cfg.memory.activation_checkpointing, cfg.memory.activation_checkpointing_mode),
                "document_masking": cfg.data.document_masking, "zero_stage": cfg.deepspeed.zero_stage,
                "precision": (resolve_precision(cfg.deepspeed, "cpu"), cfg.deepspeed.master_weights)}
    return layout(load_config(path)), layout(load_config(None, overrides))


def _compare(path: Path, tiny_data, tmp_path, backends: tuple[str, ...], *extra: str, changed: dict | None = None,
             rel: dict | None = None) -> None:
    """Eager then each compiled backend of the shrunk ``path`` (``extra``: further overrides, which
    change the kept fields named in ``changed`` to its values and no other) in one set of ``sp_size``
    ranks (dp = 1); each compiled run's losses, gradient norms and validation loss against eager's
    within ``rel[backend]`` (default ``REL``)."""
    rel = rel or REL
    eager_run = shrunk(path, tiny_data, tmp_path / "eager", *extra)
    file_layout, run_layout = _kept(path, eager_run)
    assert run_layout == {**file_layout, **(changed or {})}
    runs = [eager_run, *(shrunk(path, tiny_data, tmp_path / b, *extra, f"--run.compile={b}") for b in backends)]
    eager, *compiled = run_training(run_layout["sp_size"], *runs)
    assert len(eager["losses"]) == 4
    for backend, run in zip(backends, compiled):
        for key in ("losses", "grad_norms", "val_loss"):
            assert run[key] == pytest.approx(eager[key], rel=rel[backend]), (backend, key, run[key], eager[key])


def _zero3_way_out(path: Path) -> dict:
    """A ZeRO-3 config is refused compiled (``RunConfig.validate``, one line); its runs take the way out
    the refusal names, ZeRO-2, every other field kept: ``_compare``'s ``extra`` and ``changed``."""
    if load_config(path).deepspeed.zero_stage != 3:
        return {}
    for backend in ("inductor", "aot_eager"):
        with pytest.raises(ValueError, match=r"with \[deepspeed\]\.zero_stage = 3 cannot run"):
            load_config(path, [f"--run.compile={backend}"])
    return {"extra": ("--deepspeed.zero_stage=2",), "changed": {"zero_stage": 2}}


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_compiles_as_eager(path, tiny_data, tmp_path):
    """Every shipped config, eager vs ``aot_eager`` vs ``inductor``, in ``sp_size`` ranks (8 for the
    128k config: its ZeRO-3 refused compiled, run at ZeRO-2)."""
    way_out = _zero3_way_out(path)
    _compare(path, tiny_data, tmp_path, ("aot_eager", "inductor"), *way_out.get("extra", ()),
             changed=way_out.get("changed"))


@pytest.mark.slow
def test_32k_config_compiles_in_bf16(tiny_data, tmp_path):
    """bf16 on CPU (DeepSpeed's CPU accelerator, fp32 master weights), the 32k config at SP = 2."""
    _compare(CONFIG_32K, tiny_data, tmp_path, ("aot_eager", "inductor"), "--parallel.sp_size=2",
             "--deepspeed.precision=bf16", changed={"sp_size": 2, "precision": ("bf16", "fp32")},
             rel=REL_BF16)
