"""Run config: TOML loading, precedence, unknown keys, checks, resolved round-trip, every shipped config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tomllib
import torch

from plsh_dist.config import (
    RunConfig,
    config_from_table,
    load_config,
    lr_at,
    parse_overrides,
    resolve_master_weights,
    resolve_precision,
    to_toml,
    write_resolved,
)
from plsh_dist.train.deepspeed_config import deepspeed_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_precedence_cli_over_file_over_defaults(tmp_path):
    path = _write(tmp_path, "[optim]\nlr = 1e-3\nwarmup_steps = 5\n[data]\nseq_len = 128\n")
    cfg = load_config(path, ["--optim.lr=2e-3", "--run.out_dir", "somewhere", "--attention.bias=none"])
    assert cfg.optim.lr == 2e-3  # CLI
    assert cfg.optim.warmup_steps == 5  # file
    assert cfg.optim.beta2 == 0.95  # default
    assert cfg.data.seq_len == 128
    assert cfg.run.out_dir == "somewhere"  # bare word kept as a string
    assert cfg.attention.bias == "none"


def test_unknown_keys_and_sections_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['lrr'\] in \[optim\]; valid keys are \['lr'"):
        load_config(_write(tmp_path, "[optim]\nlrr = 1\n"))
    with pytest.raises(ValueError, match=r"unknown section\(s\) \['optimizer'\]"):
        load_config(None, ["--optimizer.lr=1"])
    with pytest.raises(ValueError, match=r"\[attention\] unknown keys \['slope'\]"):
        load_config(None, ["--attention.slope=1"])
    with pytest.raises(ValueError, match=r"\[model\] unknown keys \['layers'\]"):
        load_config(None, ["--model.layers=3"])
    with pytest.raises(ValueError, match="--section.key=value"):
        parse_overrides(["--lr=1"])


@pytest.mark.parametrize("override,field", [
    ("--optim.lr=-1", "[optim].lr"),
    ("--optim.min_lr=1.0", "[optim].min_lr"),
    ("--deepspeed.zero_stage=4", "[deepspeed].zero_stage"),
    ("--run.max_steps=0", "[run].max_steps"),
    ("--run.device=tpu", "[run].device"),
    ("--parallel.sp_size=0", "[parallel].sp_size"),
    ("--attention.bias=rotary", "attention.bias"),
    ("--data.seq_len=0", "seq_len"),
])
def test_bad_values_fail_naming_the_field(override, field):
    with pytest.raises(ValueError) as err:
        load_config(None, [override])
    assert field in str(err.value)


def test_seq_len_must_split_over_sp():
    with pytest.raises(ValueError, match=r"\[data\].seq_len=100 is not divisible by \[parallel\].sp_size=3"):
        load_config(None, ["--data.seq_len=100", "--parallel.sp_size=3"])
    cfg = load_config(None, ["--parallel.sp_size=4"])
    with pytest.raises(ValueError, match="world_size=6"):
        cfg.validate(world_size=6)


def test_model_and_attention_are_resolved_by_load_config(tmp_path):
    """[model] / [attention] come back as full tables: preset expanded, defaults
    filled, vocab_size the tokenizer's ([tokenizer].vocab_size when no tokenizer file exists yet)."""
    import dataclasses

    from plsh_dist.models import AttentionConfig, presets

    tok = [f"--tokenizer.model_path={tmp_path / 'not_trained_yet.model'}", "--tokenizer.vocab_size=640"]
    cfg = load_config(None, [*tok, "--model.preset=tiny", "--model.num_layers=3", "--attention.bias=alibi"])
    assert cfg.model == dataclasses.replace(presets["tiny"], num_layers=3, vocab_size=640)
    assert cfg.attention == AttentionConfig(bias="alibi")
    assert config_from_table(cfg.to_dict()) == cfg  # resolving a resolved config changes nothing
    assert load_config(None, [*tok, "--model.vocab_size=700"]).model.vocab_size == 700  # an explicit one wins


def test_resolved_config_round_trips(tmp_path):
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]  # data paths must exist (checked by load_config)
    for f in files:
        f.write_text("x = 1\n")
    cfg = load_config(None, ["--optim.lr=5e-4", f"--data.train_files=['{files[0]}', '{files[1]}']",
                             "--attention.sigma=256.0"])
    path = write_resolved(cfg, tmp_path)
    again = load_config(path)
    assert again.to_dict() == cfg.to_dict()
    assert (tmp_path / "config.resolved.json").is_file()
    assert "[optim]" in to_toml(cfg)


def _ds(ds, optim, device_type):
    """The DeepSpeed dict of ``ds`` on ``device_type``, its precision resolved first (as ``resolve_run`` does)."""
    return deepspeed_config(ds, optim, micro_batch_size=2, device_type=device_type,
                            precision=resolve_precision(ds, device_type),
                            master_weights=resolve_master_weights(ds, device_type))


def test_deepspeed_config_is_generated():
    cfg = load_config(None, ["--deepspeed.zero_stage=3", "--optim.grad_accum_steps=4", "--optim.grad_clip=0.5"])
    ds = _ds(cfg.deepspeed, cfg.optim, "cpu")
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["gradient_accumulation_steps"] == 4 and ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_clipping"] == 0.5
    assert ds["bf16"]["enabled"] is False  # fp32 on CPU
    assert _ds(cfg.deepspeed, cfg.optim, "cuda")["bf16"]["enabled"]
    bf16 = load_config(None, ["--deepspeed.precision=bf16", "--deepspeed.zero_stage=0"]).deepspeed
    assert resolve_precision(bf16, "cpu") == "bf16"
    plain = _ds(bf16, cfg.optim, "cpu")
    assert plain["bf16"] == {"enabled": True} and "data_types" not in plain  # DeepSpeed refuses fp32 accumulation at ZeRO 0
    bf16.zero_stage = 1
    assert _ds(bf16, cfg.optim, "cpu")["data_types"] == {"grad_accum_dtype": "fp32"}
    pure = load_config(None, ["--deepspeed.precision=bf16", "--deepspeed.master_weights=bf16",
                              "--deepspeed.zero_stage=1"]).deepspeed
    pure_ds = _ds(pure, cfg.optim, "cpu")
    assert pure_ds["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    assert "data_types" not in pure_ds


def test_lr_warmup_then_cosine():
    optim = load_config(None, ["--optim.lr=1.0", "--optim.min_lr=0.1", "--optim.warmup_steps=4"]).optim
    assert [lr_at(s, optim, 104) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, optim, 104) == pytest.approx(1.0)
    assert lr_at(54, optim, 104) == pytest.approx(0.55)  # half way down the cosine
    assert lr_at(104, optim, 104) == pytest.approx(0.1)
    assert lr_at(500, optim, 104) == pytest.approx(0.1)
    values = [lr_at(s, optim, 104) for s in range(4, 105)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_shipped_configs_exist():
    names = {p.stem for p in CONFIGS}
    assert {"quickstart"} <= names and len(names) >= 8


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_builds_its_model_on_meta(path):
    from plsh_dist.models import build_model, count_parameters

    cfg = load_config(path)
    world = cfg.parallel.sp_size  # the smallest world the layout accepts
    cfg.validate(world_size=world)
    model = build_model(cfg.model, cfg.attention, device="meta")
    n = count_parameters(model)
    assert n > 0 and all(p.device.type == "meta" for p in model.parameters())
    if tomllib.loads(path.read_text()).get("model", {}).get("preset") == "qwen3-0.6b":
        # 0.6B architecture: 440,467,456 non-embedding parameters whatever the vocabulary.
        assert count_parameters(model, exclude_embeddings=True) == 440_467_456
        assert cfg.data.seq_len >= 8192
    assert math.isfinite(float(n))
    assert isinstance(cfg, RunConfig) and config_from_table(cfg.to_dict()).to_dict() == cfg.to_dict()


def test_launcher_rejects_a_bad_config_before_any_work(tmp_path):
    """Bad value on the command line: exit 2 with the field and the fix; nothing written."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "never"
    proc = subprocess.run(
        [sys.executable, str(root / "launchers" / "pretrain.py"), "--config", str(root / "configs" / "quickstart.toml"),
         f"--run.out_dir={out}", "--local_rank=0", "--deepspeed.zero_stage=5"],
        capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "DS_ACCELERATOR": "cpu"},
    )
    assert proc.returncode == 2
    assert "[deepspeed].zero_stage = 5 is invalid; choose one of [0, 1, 2, 3]" in proc.stderr
    assert not out.exists()
