"""[model].init_from: a tiny RoPE Qwen3 written by transformers' save_pretrained is
continued under PLSH with rope off; its weights are what training starts from
(exactly); wrong architectures, shapes, tokenizers, pickle files and missing
directories are refused at load_config, naming the field and the fix."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import transformers

from plsh_dist.config import load_config, to_toml
from plsh_dist.models import AttentionRuntime
from plsh_dist.models.pretrained import initial_model
from tests.train.conftest import base_overrides
from tests.train.spawn import run_training

VOCAB = 512  # tiny_data's tokenizer


def _source(path, *, zero_head: bool = False, **over):
    """A tiny RoPE Qwen3 in transformers' own classes, saved as safetensors."""
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=4096,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    kw.update(over)
    torch.manual_seed(11)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**kw))
    if zero_head:  # tied: every logit 0, so the first loss is exactly ln(vocab)
        with torch.no_grad():
            model.model.embed_tokens.weight.zero_()
    model.save_pretrained(str(path))
    return model


def _cfg(tiny_data, out, src, *extra):
    return load_config(None, base_overrides(tiny_data, out, f"--model.init_from={src}", "--attention.bias=plsh",
                                            "--attention.rope=false", "--attention.num_samples=2",
                                            "--model.rope_theta=10000.0", *extra))


def test_initial_model_holds_the_source_weights(tiny_data, tmp_path):
    src = _source(tmp_path / "src")
    cfg = _cfg(tiny_data, tmp_path / "run", tmp_path / "src")
    assert cfg.init_from == str(tmp_path / "src")
    assert f'init_from = "{tmp_path / "src"}"' in to_toml(cfg)  # kept in the resolved config
    model_cfg, attn = cfg.model, cfg.attention
    model = initial_model(cfg, model_cfg, attn, AttentionRuntime(run_seed=cfg.run.seed), torch.device("cpu"))
    own = model.state_dict()
    for name, tensor in src.state_dict().items():
        assert torch.equal(own[name], tensor), name
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not model.model.layers[0].self_attn.plsh_binding.cfg.rope


def test_training_starts_from_the_loaded_weights(tiny_data, tmp_path):
    _source(tmp_path / "src", zero_head=True)
    (res,) = run_training(1, base_overrides(tiny_data, tmp_path / "run", f"--model.init_from={tmp_path / 'src'}",
                                            "--attention.bias=plsh", "--attention.rope=false",
                                            "--attention.num_samples=2", "--model.rope_theta=10000.0",
                                            "--run.max_steps=1", "--optim.warmup_steps=1"))
    # A random init (std 0.02) would not give ln(vocab) to 1e-5; zero embeddings do.
    assert res["losses"][0] == pytest.approx(math.log(VOCAB), abs=1e-5)


def test_bad_init_from_is_refused_naming_the_field(tiny_data, tmp_path):
    with pytest.raises(ValueError, match=r"\[model\].init_from = .* is not a directory"):
        _cfg(tiny_data, tmp_path / "run", tmp_path / "missing")
    _source(tmp_path / "wide", hidden_size=96, num_attention_heads=6, num_key_value_heads=2)
    with pytest.raises(ValueError, match=r"hidden_size: \[model\] 64 vs config.json 96.*set \[model\] to\n\[model\]"
                                         r"\nfamily = \"qwen3\""):
        _cfg(tiny_data, tmp_path / "run", tmp_path / "wide")
    _source(tmp_path / "untied", tie_word_embeddings=False)
    with pytest.raises(ValueError, match="tie_embeddings"):
        _cfg(tiny_data, tmp_path / "run", tmp_path / "untied")
    # Pickle weights: refused, never opened.
    pkl = tmp_path / "pickled"
    _source(pkl)
    (pkl / "model.safetensors").unlink()
    (pkl / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(ValueError, match="only pickle weight files.*safetensors only"):
        _cfg(tiny_data, tmp_path / "run", pkl)
    # A config.json that claims the right shapes over weights that are not.
    lying = tmp_path / "lying"
    _source(lying, intermediate_size=96)
    table = json.loads((lying / "config.json").read_text())
    (lying / "config.json").write_text(json.dumps({**table, "intermediate_size": 128}))
    cfg = _cfg(tiny_data, tmp_path / "run", lying)
    with pytest.raises(ValueError, match=r"tensor shapes differ from \[model\].*mlp"):
        initial_model(cfg, cfg.model, cfg.attention, AttentionRuntime(), torch.device("cpu"))
    # Another tokenizer than the run's.
    tok = tmp_path / "tok_src"
    _source(tok)
    (tok / "tokenizer.model").write_bytes(b"another tokenizer")
    with pytest.raises(ValueError, match=r"differs from \[tokenizer\].model_path"):
        _cfg(tiny_data, tmp_path / "run", tok)
    # Scaled rope cannot be continued with rope on.
    scaled = tmp_path / "scaled"
    _source(scaled, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="rope_type 'linear'"):
        _cfg(tiny_data, tmp_path / "run", scaled, "--attention.rope=true", "--attention.bias=none")
    _cfg(tiny_data, tmp_path / "run", scaled)  # rope off: the rotary scaling does not matter
    with pytest.raises(ValueError, match="must be a directory path"):
        _cfg(tiny_data, tmp_path / "run", "''")
    # Our own export (model_type qwen3_plsh) continues too.
    shutil.copytree(tmp_path / "wide", tmp_path / "copy")
    table = json.loads((tmp_path / "copy" / "config.json").read_text())
    (tmp_path / "copy" / "config.json").write_text(json.dumps({**table, "model_type": "qwen3_plsh"}))
    _cfg(tiny_data, tmp_path / "run", tmp_path / "copy", "--model.hidden_size=96", "--model.num_heads=6")


def test_truncated_init_from_weights_exit_2_naming_the_file(tiny_data, tmp_path):
    """A model.safetensors cut short (an interrupted copy) is refused when the config loads, before any
    work: the launcher exits 2 naming the file, not a traceback from the model build."""
    import os
    import subprocess
    import sys

    from tests.train.launcher_runs import PRETRAIN, empty_config, launcher_env

    src = tmp_path / "src"
    _source(src)
    weights = src / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    out = tmp_path / "run"
    cmd = [sys.executable, str(PRETRAIN), "--config", str(empty_config(tmp_path)),
           *base_overrides(tiny_data, out, f"--model.init_from={src}", "--attention.bias=plsh",
                           "--attention.rope=false", "--attention.num_samples=2", "--model.rope_theta=10000.0")]
    done = subprocess.run(cmd, env=launcher_env(), capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(f"config error: {weights} is damaged or truncated (") and "Traceback" not in \
        done.stderr
    assert "copy or export it again" in done.stderr
    assert not out.exists()
