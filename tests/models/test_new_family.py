"""A new model family is one entry of the family table plus its transformers classes.

The entry below, made in this file only, adds transformers' Qwen2 (Llama's layout with q/k/v biases;
its attention goes through ``ALL_ATTENTION_FUNCTIONS``, as every family's must): the run config
names it, a preset of it resolves, the planner reads it, and a tiny model of it trains, exports,
and loads back through the package's loader and transformers' own ``from_pretrained`` (also with
``trust_remote_code=True`` in a fresh Python: refused, naming the registration, until the
registration runs there) with the trained model's logits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # noqa: E402

from plsh_dist.checkpoint.export import save_export  # noqa: E402
from plsh_dist.checkpoint.loading import load_model  # noqa: E402
from plsh_dist.config import config_from_table  # noqa: E402
from plsh_dist.data.tokenizer import train_tokenizer  # noqa: E402
from plsh_dist.models import (  # noqa: E402
    AttentionConfig, AttentionRuntime, ModelConfig, build_model, get_runtime, hf_config, presets,
)
from plsh_dist.models.families import Family, register_family, unregister_family  # noqa: E402
from plsh_dist.plan.shapes import model_shapes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 384

#: The whole addition: one table entry naming transformers' classes.
QWEN2 = Family(name="qwen2", class_prefix="Qwen2", hf_config=transformers.Qwen2Config,
               hf_model=transformers.Qwen2ForCausalLM, hf_fields={"use_sliding_window": False},
               presets={"qwen2-test": dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2,
                                           num_kv_heads=1, head_dim=16, intermediate_size=64,
                                           max_position_embeddings=512, rope_theta=10000.0)})


@pytest.fixture(scope="module")
def qwen2():
    register_family(QWEN2)
    yield QWEN2
    unregister_family(QWEN2.name)


def test_the_config_presets_and_planner_read_the_entry(qwen2):
    cfg = ModelConfig.from_dict({"preset": "qwen2-test"})
    assert cfg.family == "qwen2" and presets["qwen2-test"] == cfg
    hf = cfg.to_hf_config()
    assert type(hf) is transformers.Qwen2Config and hf.sliding_window is None
    assert ModelConfig.from_hf_config(hf) == cfg
    model = build_model(cfg, AttentionConfig(bias="plsh"), device="meta")
    assert type(model) is hf_config.MODEL_CLASSES["qwen2"] and type(model).__name__ == "Qwen2PlshForCausalLM"
    assert isinstance(model, transformers.Qwen2ForCausalLM) and model.config.model_type == "qwen2_plsh"
    assert model.config._attn_implementation == "plsh_dist"
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's own layout, not Llama's
    shapes = model_shapes(cfg, AttentionConfig())
    assert shapes.family == "qwen2" and not shapes.qk_norm and shapes.layers == 2
    assert hf_config.MODEL_TYPES["qwen2_plsh"] == "qwen2"


def test_a_registered_family_cannot_be_redefined(qwen2):
    register_family(QWEN2)  # the same entry again: nothing happens
    with pytest.raises(ValueError, match="registered already"):
        register_family(Family(name="qwen2", class_prefix="Qwen2b", hf_config="Qwen2Config",
                               hf_model="Qwen2ForCausalLM"))
    with pytest.raises(ValueError, match="class_prefix 'Qwen3'"):
        register_family(Family(name="other", class_prefix="Qwen3", hf_config="Qwen2Config",
                               hf_model="Qwen2ForCausalLM"))
    with pytest.raises(ValueError, match="model.family must be one of .*register_family"):
        ModelConfig(family="gemma")


def test_a_family_trains_exports_and_loads_with_transformers(qwen2, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(Path(textwrap.__file__).read_text())
    train_tokenizer([str(text)], tmp_path / "tok", vocab_size=VOCAB, input_sentence_size=300)
    cfg = config_from_table({
        "run": {"out_dir": str(tmp_path / "run"), "seed": 5},
        "model": {"preset": "qwen2-test"},
        "attention": {"bias": "plsh", "num_samples": 4, "rope": False},
        "data": {"train_files": [str(text)], "val_files": [str(text)], "cache_dir": str(tmp_path / "cache")},
        "tokenizer": {"model_path": str(tmp_path / "tok.model"), "vocab_size": VOCAB},
    })
    assert cfg.model.family == "qwen2"
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.attention, AttentionRuntime(run_seed=cfg.run.seed))
    ids = torch.randint(4, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
    ids[:, 24:] = ids[:, :24]  # a repeat to learn
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(6):
        with get_runtime(model).at(step):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    model.eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits

    out = save_export(model, cfg, cfg.tokenizer.model_path, tmp_path / "export")
    table = json.loads((out / "config.json").read_text())
    assert table["model_type"] == "qwen2_plsh" and table["architectures"] == ["Qwen2PlshForCausalLM"]
    assert table["auto_map"] == {"AutoConfig": "configuration_plsh.Qwen2PlshConfig",
                                 "AutoModelForCausalLM": "modeling_plsh.Qwen2PlshForCausalLM"}
    with torch.no_grad():
        assert torch.equal(load_model(out).model(input_ids=ids).logits, want)  # the package's loader
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out))  # the registered Auto classes
        assert type(loaded) is hf_config.MODEL_CLASSES["qwen2"]
        assert torch.equal(loaded(input_ids=ids).logits, want)

    # transformers' remote-code path in a fresh Python: refused, naming the registration, until it runs.
    torch.save(ids, tmp_path / "ids.pt")
    code = textwrap.dedent(f"""
        import torch, transformers
        d = {str(out)!r}
        try:
            transformers.AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True)
        except ImportError as exc:
            print("REFUSED", " ".join(str(exc).split()))
        from plsh_dist.models.families import register_family
        from tests.models.test_new_family import QWEN2
        register_family(QWEN2)
        model = transformers.AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True)
        print("CLASS", type(model).__name__, type(model).__module__)
        with torch.no_grad():
            torch.save(model(input_ids=torch.load({str(tmp_path / "ids.pt")!r})).logits, {str(tmp_path / "got.pt")!r})
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "mods")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    refusal = next(line for line in res.stdout.splitlines() if line.startswith("REFUSED"))
    assert "Qwen2Plsh" in refusal and "register_family" in refusal, refusal
    # (registering imports plsh_dist.models, whose registered classes transformers then prefers to the
    # export's entry modules: an explicitly registered class wins over auto_map)
    assert "CLASS Qwen2PlshForCausalLM" in res.stdout, res.stdout
    assert torch.equal(torch.load(tmp_path / "got.pt"), want)



def test_no_code_outside_the_family_table_branches_on_a_family_name():
    """A branch on a built-in family's name (``family == "qwen3"``, a dict keyed by two of them,
    ``("Qwen3", "Llama", ...)`` compared against) anywhere but the table is what a new family would
    have to edit: none is left (the syntax-tree scan of tests/biases/test_no_bias_name_branches.py)."""
    from plsh_dist.models.families import BUILT_IN, FAMILIES
    from tests.biases.test_no_bias_name_branches import branches

    names = {n for name in BUILT_IN for n in (name, FAMILIES[name].class_prefix, FAMILIES[name].model_type)}
    table, found = ROOT / "plsh_dist" / "models" / "families.py", []
    for folder in ("plsh_dist", "launchers"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != table:
                found += [f"{path.relative_to(ROOT)}:{line}: {what}"
                          for line, what in branches(path.read_text(), names)]
    assert not found, "branches on family names outside plsh_dist/models/families.py:\n" + "\n".join(found)
