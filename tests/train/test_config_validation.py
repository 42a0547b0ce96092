"""Config validation before any work starts: one named test (or parametrized id) per case.

Each error must name the field and the fix. Cases: unknown keys, wrong types
(every field of every section, from the dataclass annotations; inf and nan
for every float), sigma <= 0,
num_samples < 1, heads vs KV heads, world size vs sp_size, seq_len vs sp_size,
missing data paths, tokenizer vocabulary larger than the model's, bf16 on a
CPU; and the launcher's exit 2 with nothing written for two of them.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import tomllib
import torch

from plsh_dist.config import (
    CheckpointSection,
    DeepSpeedSection,
    LoggingSection,
    MemorySection,
    OptimSection,
    ParallelSection,
    RunSection,
    check_world_size,
    load_config,
    resolve_master_weights,
    resolve_precision,
)
from plsh_dist.config.resolved import resolve_run
from plsh_dist.config_check import check_field_types, toml_literal
from plsh_dist.data.config import DataConfig, TokenizerConfig
from plsh_dist.data.tokenizer import train_tokenizer
from plsh_dist.models import AttentionConfig, ModelConfig
from plsh_dist.train.loop import resolve_device

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
SECTIONS = {
    "run": RunSection, "optim": OptimSection, "memory": MemorySection, "deepspeed": DeepSpeedSection,
    "parallel": ParallelSection,
    "checkpoint": CheckpointSection, "logging": LoggingSection, "data": DataConfig, "tokenizer": TokenizerConfig,
    "model": ModelConfig, "attention": AttentionConfig,
}


@pytest.fixture(autouse=True)
def _in_empty_dir(tmp_path, monkeypatch):
    """Relative default paths (tokenizer model, caches) must not hit files of the checkout."""
    monkeypatch.chdir(tmp_path)


def _error(overrides: list[str]) -> str:
    with pytest.raises(ValueError) as err:
        load_config(None, overrides)
    return str(err.value)


# --- unknown keys -----------------------------------------------------------------------


@pytest.mark.parametrize("override,expected", [
    ("--optim.lrr=1e-3", r"unknown key(s) ['lrr'] in [optim]; valid keys are ['lr'"),
    ("--data.seqlen=64", "unknown key(s) ['seqlen'] in [data]"),
    ("--model.layers=3", "[model] unknown keys ['layers']"),
    ("--attention.sigmaa=3.0", "[attention] unknown keys ['sigmaa']"),
    ("--optimizer.lr=1e-3", "unknown section(s) ['optimizer']"),
], ids=["train-section", "data-section", "model-section", "attention-section", "unknown-section"])
def test_unknown_key_is_named_with_the_valid_ones(override, expected):
    msg = _error([override])
    assert expected in msg
    assert "valid" in msg and "did you mean" in msg  # the fix: the closest valid key


# --- wrong types: every field of every section -----------------------------------------


def _wrong_values(tp) -> list[tuple[str, str, str]]:
    """(TOML literal, repr of the parsed value, its type name) that the annotation ``tp`` must refuse."""
    base = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
    if base is bool:
        return [('"yes"', "'yes'", "str"), ("1", "1", "int")]
    if base is int:
        return [('"8"', "'8'", "str"), ("true", "True", "bool"), ("1.5", "1.5", "float")]
    if base is float:  # inf and nan too: no setting means them (they would fail mid-run)
        return [('"fast"', "'fast'", "str"), ("false", "False", "bool"), ("inf", "inf", "float"),
                ("nan", "nan", "float")]
    if base is str:
        return [("5", "5", "int")]
    if typing.get_origin(base) is list:
        return [("5", "5", "int"), ("[1, 2]", "[1, 2]", "list")]
    raise AssertionError(f"no wrong values for {tp}; add them here")


def _type_cases():
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init:
                for literal, shown, type_name in _wrong_values(hints[f.name]):
                    yield pytest.param(section, f.name, literal, shown, type_name,
                                       id=f"{section}.{f.name}={type_name}")


@pytest.mark.parametrize("section,name,literal,shown,type_name", list(_type_cases()))
def test_wrong_type_names_field_type_and_example(section, name, literal, shown, type_name):
    msg = _error([f"--{section}.{name}={literal}"])
    assert msg.startswith(f"[{section}].{name} must be "), msg
    assert f", got {shown} ({type_name}); e.g. {name} = " in msg, msg
    # The example is valid TOML of the right type: written back, it passes the type check.
    example = tomllib.loads(f"v = {msg.split(f'e.g. {name} = ', 1)[1]}")["v"]
    try:
        load_config(None, [f"--{section}.{name}={toml_literal(example)}"])
    except ValueError as exc:  # a value check may still object (e.g. val_files without train_files)
        assert f"[{section}].{name} must be " not in str(exc)


def test_type_check_normalises_ints_to_floats_and_tuples_to_lists():
    cfg = load_config(None, ["--optim.lr=1", "--attention.sigma=256"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    data = DataConfig(train_files=("a.txt",))
    assert data.train_files == ["a.txt"]
    check_field_types(data, "data")  # idempotent on a checked object


# --- value checks -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0.0", "-1.0", "0", "-inf"], ids=["zero", "negative", "int-zero", "-inf"])
def test_sigma_must_be_positive(value):
    msg = _error([f"--attention.sigma={value}"])
    assert "sigma must be a finite float" in msg and "e.g. sigma = 256.0" in msg


def test_num_samples_must_be_at_least_one():
    msg = _error(["--attention.num_samples=0"])
    assert "attention.num_samples must be an int >= 1" in msg and "e.g. num_samples = 8" in msg


def test_heads_must_be_divisible_by_kv_heads():
    msg = _error(["--model.num_heads=6", "--model.num_kv_heads=4"])
    assert "model.num_heads (6) must be a multiple of model.num_kv_heads (4)" in msg
    assert "divisor of 6: [1, 2, 3, 6]" in msg


def test_world_size_must_be_divisible_by_sp_size():
    cfg = load_config(None, ["--parallel.sp_size=4", "--data.seq_len=64"])
    with pytest.raises(ValueError) as err:
        cfg.validate(world_size=6)  # what train() runs first, with the launched world size
    msg = str(err.value)
    assert "[parallel].sp_size=4 does not divide world_size=6" in msg
    assert "set sp_size to one of [1, 2, 3, 6]" in msg and "launch a multiple of 4 processes" in msg
    check_world_size(8, 4)  # a valid layout passes


def test_seq_len_must_be_divisible_by_sp_size():
    msg = _error(["--data.seq_len=100", "--parallel.sp_size=3"])
    assert "[data].seq_len=100 is not divisible by [parallel].sp_size=3" in msg
    assert "pick seq_len a multiple of 3" in msg


@pytest.mark.parametrize("field", ["train_files", "val_files"])
def test_missing_data_path_fails_in_load_config(tmp_path, field):
    real = tmp_path / "real.txt"
    real.write_text("x = 1\n")
    paths = {"train_files": str(real), "val_files": str(real), field: str(tmp_path / "missing" / "*.txt")}
    msg = _error([f"--data.{k}=['{v}']" for k, v in paths.items()])
    assert msg.startswith(f"[data].{field}: data file pattern ") and "matches no file" in msg
    assert "check the path or glob" in msg


def test_empty_data_directory_fails_in_load_config(tmp_path):
    (tmp_path / "empty").mkdir()
    msg = _error([f"--data.train_files=['{tmp_path / 'empty'}/*.txt']"])
    assert "is an empty directory" in msg


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    """A 300-piece tokenizer file (the smallest TokenizerConfig accepts)."""
    root = tmp_path_factory.mktemp("tok")
    text = root / "text.txt"
    text.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400)))
    tok = train_tokenizer([str(text)], root / "t", vocab_size=300, input_sentence_size=200)
    return root / "t.model", tok.vocab_size


def test_model_vocab_smaller_than_tokenizer_file_fails_in_load_config(small_tokenizer):
    path, vocab = small_tokenizer
    # [tokenizer].vocab_size says 8192 but the file wins (it is what encodes the data).
    msg = _error([f"--tokenizer.model_path={path}", f"--model.vocab_size={vocab - 44}"])
    assert f"[model].vocab_size = {vocab - 44} is smaller than the tokenizer's vocabulary of {vocab}" in msg
    assert f"set it >= {vocab}" in msg and str(path) in msg
    load_config(None, [f"--tokenizer.model_path={path}", f"--model.vocab_size={vocab + 20}"])  # padding is fine


def test_model_vocab_defaults_to_the_tokenizer_file(small_tokenizer):
    path, vocab = small_tokenizer
    # [tokenizer].vocab_size says 8192 but the file wins (it is what encodes the data).
    assert load_config(None, [f"--tokenizer.model_path={path}"]).model.vocab_size == vocab
    assert load_config(None, ["--tokenizer.vocab_size=512"]).model.vocab_size == 512  # no file yet


def test_model_vocab_smaller_than_tokenizer_to_train_fails_in_load_config():
    msg = _error(["--tokenizer.vocab_size=512", "--model.vocab_size=400"])
    assert "[model].vocab_size = 400 is smaller than the tokenizer's vocabulary of 512" in msg


def test_model_vocab_checked_again_once_the_tokenizer_is_ready():
    # The set-up calls run.check_tokenizer_vocab(tokenizer.vocab_size) right after preparing the data and
    # before building the model: a tokenizer file that appeared (or changed) after load_config is caught.
    run = resolve_run(load_config(None, ["--tokenizer.vocab_size=512", "--model.vocab_size=512"]), 1, CPU)
    with pytest.raises(ValueError, match=r"\[model\].vocab_size = 512 is smaller than the tokenizer's vocabulary of 600"):
        run.check_tokenizer_vocab(600)
    run.check_tokenizer_vocab(512)
    # Unset, [model].vocab_size was resolved to [tokenizer].vocab_size (no file yet): a bigger tokenizer fails.
    unset = resolve_run(load_config(None, ["--tokenizer.vocab_size=512"]), 1, CPU)
    assert unset.check_tokenizer_vocab(512) is None
    with pytest.raises(ValueError) as err:
        unset.check_tokenizer_vocab(600)
    assert "[model].vocab_size = 512 is smaller than the tokenizer's vocabulary of 600" in str(err.value)
    assert "[tokenizer].model_path" in str(err.value) and "[tokenizer].vocab_size = 600" in str(err.value)


def test_bf16_runs_on_cpu_and_auto_stays_fp32_there():
    cfg = load_config(None, ["--run.device=cpu", "--deepspeed.precision=bf16"])
    assert resolve_precision(cfg.deepspeed, "cpu") == "bf16"
    assert resolve_precision(load_config(None, ["--run.device=cpu"]).deepspeed, "cpu") == "fp32"
    assert resolve_precision(load_config(None, []).deepspeed, "cuda") == "bf16"


@pytest.mark.parametrize("overrides,expected", [
    (["--deepspeed.master_weights=bf16", "--deepspeed.precision=fp32"],
     '[deepspeed].master_weights = "bf16" needs bf16 weights, but precision = "fp32"'),
    (["--deepspeed.master_weights=bf16", "--deepspeed.precision=bf16", "--deepspeed.zero_stage=0"],
     '[deepspeed].master_weights = "bf16" needs ZeRO 1-3'),
    (["--deepspeed.master_weights=bf16", "--deepspeed.precision=bf16", "--deepspeed.zero_stage=2",
      "--deepspeed.offload_optimizer=true"], 'with offload_optimizer = true needs DeepSpeed\'s CPU Adam'),
    (["--deepspeed.master_weights=fp16"], "[deepspeed].master_weights"),
], ids=["fp32-run", "zero0", "offload", "unknown"])
def test_bf16_master_weights_are_refused_where_they_cannot_work(overrides, expected):
    assert expected in _error(overrides)


def test_flex_backend_cannot_train_and_fails_in_load_config():
    msg = _error(["--attention.bias=plsh", "--attention.backend=flex"])
    assert '[attention].backend = "flex" computes the attention output only' in msg and 'backend = "auto"' in msg


def test_compile_refuses_an_unknown_backend():
    assert "[run].compile = 'yes' is invalid" in _error(["--run.compile=yes"])


def test_compile_takes_sequence_parallelism():
    cfg = load_config(None, ["--run.compile=inductor", "--parallel.sp_size=2", "--memory.activation_checkpointing=true"])
    assert cfg.run.compile == "inductor" and cfg.parallel.sp_size == 2


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compile_refuses_zero3_in_one_line(backend):
    """ZeRO-3's parameter hooks are torch.compiler.disable'd: a graph break inside every compiled layer
    (measured: dynamo's "Skip calling torch.compiler.disable()d function", with and without checkpointing)."""
    msg = _error([f"--run.compile={backend}", "--deepspeed.zero_stage=3"])
    assert "\n" not in msg
    assert f'[run].compile = "{backend}" with [deepspeed].zero_stage = 3 cannot run' in msg
    assert 'set zero_stage = 2 (or 1) to compile, or compile = "off" to keep ZeRO-3' in msg
    assert load_config(None, [f"--run.compile={backend}", "--deepspeed.zero_stage=2"]).run.compile == backend
    assert load_config(None, ["--run.compile=off", "--deepspeed.zero_stage=3"]).deepspeed.zero_stage == 3


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_compile_takes_activation_checkpointing(mode):
    cfg = load_config(None, ["--run.compile=inductor", "--memory.activation_checkpointing=true",
                             f"--memory.activation_checkpointing_mode={mode}"])
    assert cfg.memory.activation_checkpointing and cfg.memory.activation_checkpointing_mode == mode


@pytest.mark.parametrize("overrides,expected", [
    (["--memory.activation_checkpointing=true", "--memory.activation_checkpointing_mode=partial"],
     "[memory].activation_checkpointing_mode = 'partial' is invalid; choose one of ['full', 'selective']"),
    (["--memory.activation_checkpointing_mode=selective"],
     '[memory].activation_checkpointing_mode = "selective" needs activation_checkpointing = true'),
], ids=["unknown", "without-checkpointing"])
def test_activation_checkpointing_mode_is_checked(overrides, expected):
    assert expected in _error(overrides)


@pytest.mark.skipif(torch.cuda.is_available(), reason="device auto resolves to CPU only without a GPU")
def test_bf16_master_weights_with_auto_precision_on_cpu_fail_at_train_start():
    cfg = load_config(None, ["--run.device=auto", "--deepspeed.master_weights=bf16", "--deepspeed.zero_stage=1"])
    with pytest.raises(ValueError, match='precision = "auto" is fp32 on cpu'):
        resolve_master_weights(cfg.deepspeed, resolve_device(cfg.run.device).type)  # train()'s first checks


# --- the launcher -------------------------------------------------------------------


@pytest.mark.parametrize("overrides,expected", [
    (["--data.train_files=['no/such/dir/*.txt']"], "[data].train_files: data file pattern 'no/such/dir/*.txt'"),
    (["--deepspeed.master_weights=bf16", "--parallel.sp_size=1"],
     '[deepspeed].master_weights = "bf16" needs bf16 weights, but precision = "auto" is fp32 on cpu'),
    (["--attention.sigma=inf"], "[attention].sigma must be a finite float (or left out), got inf (float); "
                                "e.g. sigma = 256.0"),
    (["--attention.sigma=nan"], "[attention].sigma must be a finite float (or left out), got nan (float)"),
], ids=["missing-data-path", "bf16-master-weights-on-fp32", "sigma-inf", "sigma-nan"])
def test_launcher_exits_2_and_writes_nothing(tmp_path, overrides, expected):
    out = tmp_path / "never"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config", str(ROOT / "configs" / "quickstart.toml"),
         f"--run.out_dir={out}", "--local_rank=0", *overrides],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "config error: " in proc.stderr and expected in proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no corpus, cache, tokenizer or output



@pytest.mark.parametrize("where", ["existing-file", "unwritable-dir"])
def test_launcher_refuses_an_out_dir_it_cannot_write(tmp_path, where):
    """An out_dir that is a file or cannot be written (read-only filesystem, permissions): exit 2 before any
    work, one message naming [run].out_dir, nothing written (the cases: tests/test_writable.py)."""
    from tests.unwritable import unwritable_dir

    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()

    def launch():
        return subprocess.run(
            [sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config",
             str(ROOT / "configs" / "quickstart.toml"), f"--run.out_dir={out}", "--local_rank=0"],
            capture_output=True, text=True, timeout=120, cwd=work,
            env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})

    if where == "existing-file":
        out.write_text("a file\n")
        proc = launch()
        expected = "is an existing file, not a directory; choose another [run].out_dir"
    else:
        with unwritable_dir(out):
            proc = launch()
        expected = "is not writable (a read-only filesystem or no permission); choose another [run].out_dir"
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"config error: [run].out_dir = {str(out)!r} ") and expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(work.iterdir()) == []  # no corpus, cache or tokenizer either
    assert out.is_file() or list(out.iterdir()) == []
