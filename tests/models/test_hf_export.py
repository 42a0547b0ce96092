"""Self-describing exports: after ``import plsh_dist.models``, transformers'
``AutoModelForCausalLM`` / ``AutoTokenizer`` rebuild exactly the model and ids of
training-time evaluation; without it, transformers refuses the directory; bad
exports fail naming the file and field; the converter rewrites DeepSpeed tags
and older exports. Tiny models (hidden 32, 2 layers), a 320-piece tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # noqa: E402

from plsh_dist.checkpoint.export import convert_to_export, save_export  # noqa: E402
from plsh_dist.checkpoint.loading import load_model  # noqa: E402
from plsh_dist.config import config_from_table, write_resolved  # noqa: E402
from plsh_dist.data.tokenizer import Tokenizer, train_tokenizer  # noqa: E402
from plsh_dist.models import AttentionRuntime, build_model, get_runtime, hf_config  # noqa: E402
from plsh_dist.train.validation import validation_loss  # noqa: E402
from tests.launchers import load_launcher  # noqa: E402

VOCAB = 384
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_export")
    text = root / "text.txt"
    text.write_text(Path(textwrap.__file__).read_text())
    train_tokenizer([str(text)], root / "tok", vocab_size=VOCAB, input_sentence_size=300)
    return root


def _run_config(root: Path, family: str, attention: dict, *, seed: int = 7, vocab: int = VOCAB):
    """A resolved run config; data and tokenizer under ``root`` (the ``corpus`` fixture's)."""
    return config_from_table({
        "run": {"out_dir": str(root / "run"), "seed": seed},
        "model": dict(family=family, vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=16, intermediate_size=64, max_position_embeddings=512, rope_theta=10000.0),
        "attention": attention,
        "data": {"train_files": [str(root / "text.txt")], "val_files": [str(root / "text.txt")],
                 "cache_dir": str(root / "cache")},
        "tokenizer": {"model_path": str(root / "tok.model"), "vocab_size": VOCAB},
    })


def _export(corpus: Path, out: Path, family: str = "qwen3", attention: dict | None = None, **kw) -> Path:
    cfg = _run_config(corpus, family, attention or {"bias": "plsh", "num_samples": 4, "rope": False}, **kw)
    model_cfg, attn = cfg.model, cfg.attention
    torch.manual_seed(0)
    model = build_model(model_cfg, attn, AttentionRuntime(run_seed=cfg.run.seed))
    return save_export(model, cfg, cfg.tokenizer.model_path, out)


CASES = [
    ("qwen3", {"bias": "plsh", "num_samples": 4, "rope": False}),  # per-head sigma = 1/alibi slope
    ("qwen3", {"bias": "plsh", "num_samples": 3, "sigma": 6.0, "sampler": "stratified", "fixed_masks": True}),
    ("llama", {"bias": "alibi", "sigma": 16.0, "rope": False}),
    ("mistral", {"bias": "none", "rope": True}),
    ("qwen3", {"bias": "window", "window": 8, "rope": True}),
]


@pytest.mark.parametrize("family,attention", CASES, ids=[f"{f}-{a['bias']}" for f, a in CASES])
def test_from_pretrained_equals_training_time_evaluation(corpus, tmp_path, family, attention):
    out = _export(corpus, tmp_path / "final", family, attention)
    table = json.loads((out / "config.json").read_text())
    assert table["model_type"] == f"{family}_plsh"
    assert table["architectures"] == [f"{family.capitalize()}PlshForCausalLM"]
    section = table["plsh_dist"]
    assert section["hash_seed"]["run_seed"] == 7 and section["attention"]["bias"] == attention["bias"]
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["use_cache"] is True and (gen["eos_token_id"], gen["pad_token_id"]) == (2, 3)

    ref = load_model(out).model  # the loader: what evaluation and validation use
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert type(model) is hf_config.MODEL_CLASSES[family] and not model.training
    assert model.config._attn_implementation == "plsh_dist"
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)
    # The training loop's validation (step 0 masks, run seed): the same loss.
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "position_ids": torch.arange(39).expand(2, 39)}
    cpu = torch.device("cpu")
    assert validation_loss(model, [batch], get_runtime(model), cpu) == validation_loss(ref, [batch],
                                                                                       get_runtime(ref), cpu)
    # A re-saved loaded model stays self-describing.
    model.save_pretrained(str(tmp_path / "again"))
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "again"))
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_tokenizer_gives_the_training_ids(corpus, tmp_path):
    out = _export(corpus, tmp_path / "final")
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    own = Tokenizer.load(out / "tokenizer.model")
    assert type(tok).__name__ == "PlshTokenizer" and len(tok) == VOCAB
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (own.eos_id, own.pad_id, own.bos_id)
    for text in [Path(json.__file__).read_text()[:6000], "x\u2581y <s></s><pad>\t\t  12345 \u00fc \u65e5\n", ""]:
        ids = tok(text).input_ids
        assert ids == own.encode(text) and tok.decode(ids) == text


def test_without_plsh_dist_transformers_refuses(corpus, tmp_path):
    """Without the import and without trust_remote_code: a loud error asking for trust_remote_code=True
    (not transformers' "out of date" advice), never RoPE/SDPA weights."""
    out = _export(corpus, tmp_path / "final")
    code = textwrap.dedent(f"""
        import transformers
        try:
            transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})
        except ValueError as exc:
            print("REFUSED", " ".join(str(exc).split()))
        else:
            print("LOADED")
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": "", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert "REFUSED" in res.stdout and "LOADED" not in res.stdout, res.stdout + res.stderr  # (after its y/N prompt)
    refusal = res.stdout.split("REFUSED", 1)[1]
    assert "trust_remote_code=True" in refusal and "out of date" not in refusal, refusal


def test_trust_remote_code_loads_an_export_with_no_import(corpus, tmp_path):
    """transformers' auto_map convention: a fresh interpreter that never imports plsh_dist itself gets
    the same model (logits equal bit for bit) and the same tokenizer ids."""
    out = _export(corpus, tmp_path / "final")
    table = json.loads((out / "config.json").read_text())
    assert table["auto_map"] == {"AutoConfig": "configuration_plsh.Qwen3PlshConfig",
                                 "AutoModelForCausalLM": "modeling_plsh.Qwen3PlshForCausalLM"}
    text = "def f(x):\n    return x * 2\n"
    code = textwrap.dedent(f"""
        import json, sys, torch, transformers
        d = {str(out)!r}
        model = transformers.AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True)
        tok = transformers.AutoTokenizer.from_pretrained(d, trust_remote_code=True)
        ids = tok({text!r}, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        print(json.dumps({{"ids": ids[0].tolist(), "logits": logits[0, -1].tolist(),
                           "class": type(model).__name__}}))
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "mods")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=180, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(out))  # after import plsh_dist.models
    ids = Tokenizer.load(out / "tokenizer.model").encode(text)
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([ids])).logits[0, -1].tolist()
    assert got["class"] == "Qwen3PlshForCausalLM" and got["ids"] == ids and got["logits"] == want


def test_a_resaved_export_loads_in_a_fresh_python(corpus, tmp_path):
    """from_pretrained then save_pretrained (model and tokenizer) writes a directory as loadable as
    the export: a fresh interpreter that never imports plsh_dist itself loads it with
    trust_remote_code=True and gets the export's logits, whether the re-save ran under remote code
    (a fresh interpreter) or after ``import plsh_dist.models`` (this process)."""
    out = _export(corpus, tmp_path / "final")
    here = tmp_path / "resaved_here"
    transformers.AutoModelForCausalLM.from_pretrained(str(out)).save_pretrained(str(here))
    transformers.AutoTokenizer.from_pretrained(str(out)).save_pretrained(str(here))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "mods")}

    def fresh(code):
        res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=180, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout

    remote = tmp_path / "resaved_remote"
    fresh(f"""
        import transformers
        d, new = {str(out)!r}, {str(remote)!r}
        transformers.AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True).save_pretrained(new)
        transformers.AutoTokenizer.from_pretrained(d, trust_remote_code=True).save_pretrained(new)
    """)
    text = "def f(x):\n    return x * 2\n"
    got = json.loads(fresh(f"""
        import json, torch, transformers
        rows = {{}}
        for d in {[str(here), str(remote)]!r}:
            model = transformers.AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True)
            tok = transformers.AutoTokenizer.from_pretrained(d, trust_remote_code=True)
            ids = tok({text!r}, return_tensors="pt").input_ids
            with torch.no_grad():
                rows[d] = {{"ids": ids[0].tolist(), "logits": model(input_ids=ids).logits[0].tolist()}}
        print(json.dumps(rows))
    """).strip().splitlines()[-1])
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    ids = Tokenizer.load(out / "tokenizer.model").encode(text)
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([ids])).logits[0].tolist()
    for d in (here, remote):
        table = json.loads((d / "config.json").read_text())
        assert table["auto_map"] == {"AutoConfig": "configuration_plsh.Qwen3PlshConfig",
                                     "AutoModelForCausalLM": "modeling_plsh.Qwen3PlshForCausalLM"}, d
        assert table["plsh_dist"] == json.loads((out / "config.json").read_text())["plsh_dist"], d
        assert got[str(d)] == {"ids": ids, "logits": want}, d


def _edit(src: Path, dst: Path, fn) -> Path:
    shutil.copytree(src, dst)
    table = json.loads((dst / "config.json").read_text())
    fn(table)
    (dst / "config.json").write_text(json.dumps(table))
    return dst


def test_bad_exports_fail_naming_file_and_field(corpus, tmp_path):
    out = _export(corpus, tmp_path / "final")
    load = transformers.AutoModelForCausalLM.from_pretrained
    cases = [
        (lambda t: t.pop("plsh_dist"), "has no 'plsh_dist' section"),
        (lambda t: t["plsh_dist"]["attention"].update(num_samples=0), "plsh_dist.attention.num_samples"),
        (lambda t: t["plsh_dist"]["attention"].pop("rope"), r"lacks \['rope'\]"),
        (lambda t: t["plsh_dist"]["hash_seed"].pop("run_seed"), "hash_seed.run_seed"),
        (lambda t: t["plsh_dist"].update(format=99), "format"),
        (lambda t: t.update(num_hidden_layers=3), "describe different models.*num_layers"),
        (lambda t: t["plsh_dist"]["attention"].update(bias="alibi"), "describe different models.*attention.bias"),
    ]
    for i, (fn, match) in enumerate(cases):
        bad = _edit(out, tmp_path / f"bad{i}", fn)
        with pytest.raises(ValueError, match=match) as info:
            load(str(bad))
        assert "config" in str(info.value)
        if "different" in match:  # evaluation's loader runs the same check
            with pytest.raises(ValueError, match=match):
                load_model(bad)
    with pytest.raises(ValueError, match="without that positional bias"):
        load(str(out), attn_implementation="sdpa")
    with pytest.raises(OSError):  # transformers' own loader: neither a directory nor a Hub id
        hf_config.Qwen3PlshForCausalLM.from_pretrained(str(tmp_path / "missing"))
    # A tokenizer with more pieces than the embedding has rows.
    small = _export(corpus, tmp_path / "small", vocab=VOCAB - 40)
    with pytest.raises(ValueError, match="tokenizer.model has 384 pieces but the model.s embedding has 344 rows"):
        load(str(small))
    # Pickle weights are never opened.
    pkl = tmp_path / "pickled"
    pkl.mkdir()
    (pkl / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(ValueError, match="only pickle weight files"):
        hf_config.read_safetensors_dir(pkl)


def test_converter_rewrites_deepspeed_tags_and_old_exports(corpus, tmp_path):
    cfg = _run_config(corpus, "qwen3", {"bias": "plsh", "num_samples": 2, "sigma": 4.0})
    model_cfg, attn = cfg.model, cfg.attention
    torch.manual_seed(3)
    model = build_model(model_cfg, attn, AttentionRuntime(run_seed=cfg.run.seed)).eval()
    ids = torch.randint(0, VOCAB, (1, 33), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    # A DeepSpeed ZeRO 0-2 tag: module weights + resolved config + tokenizer.
    tag = tmp_path / "run" / "checkpoints" / "step_00000005"
    tag.mkdir(parents=True)
    torch.save({"module": model.state_dict()}, tag / "mp_rank_00_model_states.pt")
    write_resolved(cfg, tag)
    shutil.copy2(cfg.tokenizer.model_path, tag / "tokenizer.model")
    out = convert_to_export(tag, tmp_path / "exported")
    with torch.no_grad():
        assert torch.equal(transformers.AutoModelForCausalLM.from_pretrained(str(out))(input_ids=ids).logits, want)
    assert transformers.AutoTokenizer.from_pretrained(str(out))("abc").input_ids == Tokenizer.load(
        cfg.tokenizer.model_path).encode("abc")
    with pytest.raises(ValueError, match="not empty"):
        convert_to_export(tag, out)
    # An export from before config.json described the attention: plain qwen3.
    old = tmp_path / "old"
    transformers.Qwen3ForCausalLM(model_cfg.to_hf_config(attn_implementation="sdpa")).save_pretrained(str(old))
    from safetensors.torch import save_file

    save_file({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}, str(old / "model.safetensors"))
    write_resolved(cfg, old)
    shutil.copy2(cfg.tokenizer.model_path, old / "tokenizer.model")
    with pytest.warns(UserWarning, match="convert_checkpoint"):
        load_model(old)
    convert_checkpoint = load_launcher("convert_checkpoint")
    with pytest.warns(UserWarning):
        assert convert_checkpoint.main(["--checkpoint", str(old), "--out", str(tmp_path / "new")]) == 0
    with torch.no_grad():
        got = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "new"))(input_ids=ids).logits
    assert torch.equal(got, want)


def test_converter_names_the_tags_that_exist_when_one_was_pruned(tmp_path):
    """The README's convert command on a run whose keep_last pruned the tag: exit 2, the existing tags listed."""
    ckpts = tmp_path / "run" / "checkpoints"
    for tag in ("step_00000200", "step_00000250"):
        (ckpts / tag).mkdir(parents=True)
        (ckpts / tag / "trainer_state.json").write_text("{}")
    (ckpts / "step_00000300.partial").mkdir()  # not a tag: not offered
    done = subprocess.run([sys.executable, str(ROOT / "launchers" / "convert_checkpoint.py"), "--checkpoint",
                           str(ckpts / "step_00000100"), "--out", str(tmp_path / "exports" / "q100")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(
        f"convert_checkpoint: error: checkpoint {str(ckpts / 'step_00000100')!r} does not exist; the checkpoints "
        f"in {ckpts} are step_00000200, step_00000250 ([checkpoint].keep_last prunes older ones); pass one of them, "
        f"or the run directory {tmp_path / 'run'}"), done.stderr
    assert not (tmp_path / "exports").exists()


def test_export_without_resolved_config_loads_from_config_json(corpus, tmp_path):
    """An export copied without config.resolved.json loads as transformers loads it: architecture,
    attention and seed from config.json; what needs the run's data asks for it."""
    from plsh_dist.eval.extrapolation import EvalSettings, evaluate_checkpoint

    full = _export(corpus, tmp_path / "full", attention={"bias": "plsh", "num_samples": 3, "sigma": 6.0,
                                                         "rope": False}, seed=11)
    bare = tmp_path / "bare"
    shutil.copytree(full, bare)
    (bare / "config.resolved.json").unlink()
    (bare / "config.resolved.toml").unlink(missing_ok=True)
    want, got = load_model(full), load_model(bare)
    assert got.run_config_file is None and want.run_config_file == full / "config.resolved.json"
    assert got.model_cfg == want.model_cfg and got.trained_attention == want.trained_attention
    assert got.run_config.run.seed == 11
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(got.model(input_ids=ids).logits, want.model(input_ids=ids).logits)
    settings = EvalSettings([16], "alibi", max_windows=1, progress=False)
    with pytest.raises(ValueError, match="has no config.resolved.json, so the data its model was trained on is "
                                         "unknown; pass --data PATH"):
        evaluate_checkpoint(bare, settings)
    res = evaluate_checkpoint(bare, EvalSettings([16], "alibi", max_windows=1, progress=False,
                                                 data=str(corpus / "text.txt")))
    assert res["trained"]["seq_len"] is None and res["rows"]
    with pytest.raises(ValueError, match="a new export would record default training settings"):
        convert_to_export(bare, tmp_path / "again")
    (bare / "config.json").write_text(json.dumps({**json.loads((bare / "config.json").read_text()),
                                                  "model_type": "qwen3"}))
    with pytest.raises(ValueError, match="does not state the attention the weights were trained with"):
        load_model(bare)


def test_config_json_agrees_with_generation_config(corpus, tmp_path):
    """config.json gives the same special ids and cache setting as generation_config.json
    (a reader of either file, or a tool reading config.json only, sees one answer)."""
    out = _export(corpus, tmp_path / "final")
    table = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "use_cache"):
        assert table[key] == gen[key], (key, table[key], gen[key])
    assert (table["eos_token_id"], table["pad_token_id"], table["use_cache"]) == (2, 3, True)


def test_attention_is_chosen_at_load_time_and_an_edited_config_json_is_refused(corpus, tmp_path):
    """The supported way to run an export under another attention is a keyword of from_pretrained
    (with trust_remote_code, as a user without our import loads it): the same weights, the chosen mode,
    equal to set_attention_mode on the trained model. Editing config.json's plsh_dist section instead
    (bias plsh -> alibi) is refused with one message naming the field and the keyword: a ValueError from
    Python, exit 2 and no traceback from generate.py, whose --mode is the launchers' way."""
    import dataclasses

    from plsh_dist.models import AttentionConfig, set_attention_mode

    out = _export(corpus, tmp_path / "final")
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(4))
    trained = load_model(out)
    alibi_cfg = dataclasses.replace(trained.trained_attention, bias="alibi")
    ref = set_attention_mode(trained.model, alibi_cfg)
    load = transformers.AutoModelForCausalLM.from_pretrained
    for attention in ({"bias": "alibi"}, alibi_cfg):
        model = load(str(out), trust_remote_code=True, attention=attention)
        assert model.config.plsh_dist["attention"] == alibi_cfg.to_dict()
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)
    with pytest.raises(ValueError, match=r"attention=\{'bais': 'alibi'\}.*unknown keys \['bais'\]"):
        load(str(out), trust_remote_code=True, attention={"bais": "alibi"})

    edited = _edit(out, tmp_path / "edited", lambda t: t["plsh_dist"]["attention"].update(bias="alibi"))
    fix = "attention={'bias': 'alibi'}"
    for loader in (lambda d: load(str(d), trust_remote_code=True), load_model):
        with pytest.raises(ValueError) as info:
            loader(edited)
        msg = str(info.value)
        assert "attention.bias: 'plsh' in config.resolved.json, 'alibi' in config.json" in msg, msg
        assert fix in msg and "--mode alibi" in msg, msg
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "launchers" / "generate.py"), "--checkpoint", str(edited),
                           "--prompt", "def f(", "--max-new-tokens", "2"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stderr.count("generate: error:") == 1, done.stderr
    assert "attention.bias" in done.stderr and "--mode alibi" in done.stderr, done.stderr


def test_the_printed_fix_for_pickle_weights_works_as_written(corpus, tmp_path):
    """A plsh export re-saved as pytorch_model.bin is refused as [model].init_from; the conversion the
    refusal prints, run as written in a fresh Python, gives a directory init_from accepts, with the
    same weights and the export's other files. (The fix it printed, transformers' from_pretrained then
    save_pretrained, failed for an export: "contains custom code" without trust_remote_code=True, and
    with it the export's own loader, which reads safetensors only.)"""
    import re

    from plsh_dist.models.pretrained import check_init_from

    cfg = _run_config(corpus, "qwen3", {"bias": "plsh", "num_samples": 4, "rope": False})
    out = _export(corpus, tmp_path / "final")
    pkl = tmp_path / "pickled"
    shutil.copytree(out, pkl)
    (pkl / "model.safetensors").unlink()
    # transformers 5 writes safetensors only: the pickle file as older versions (and torch) write it.
    torch.save(transformers.AutoModelForCausalLM.from_pretrained(str(out)).state_dict(), pkl / "pytorch_model.bin")
    with pytest.raises(ValueError) as err:
        check_init_from(pkl, cfg.model, cfg.attention, cfg.tokenizer.model_path)
    printed = re.search(r'python -c "([^"]+)" and point at (\S+)$', str(err.value))
    assert printed, str(err.value)
    code, converted = printed.group(1), Path(printed.group(2))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=180,
                          stdin=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert check_init_from(converted, cfg.model, cfg.attention, cfg.tokenizer.model_path) is not None
    assert sorted(p.name for p in converted.iterdir()) == sorted(p.name for p in out.iterdir())
    got, want = (transformers.AutoModelForCausalLM.from_pretrained(str(d)).state_dict() for d in (converted, out))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_transformers_own_loader_takes_its_keywords(corpus, tmp_path):
    """from_pretrained is transformers' PreTrainedModel.from_pretrained with the package's checks and
    ``attention`` on top: the keywords tools pass (lm-evaluation-harness passes gguf_file, max_memory and
    quantization_config as None) load the same model, a keyword transformers refuses gets transformers'
    own error, and output_attentions is refused in a message about attention weights (before: every
    keyword outside an allow-list was refused, output_attentions with one about attn_implementation='eager')."""
    out = _export(corpus, tmp_path / "final")
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(5))
    ref = load_model(out).model
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    load = transformers.AutoModelForCausalLM.from_pretrained
    same = [dict(device_map="auto"), dict(device_map="auto", max_memory={"cpu": "2GiB"}), dict(device_map="cpu"),
            dict(low_cpu_mem_usage=True), dict(quantization_config=None, gguf_file=None, max_memory=None),
            dict(revision="main"), dict(dtype=torch.float32), dict(dtype="auto"), dict(output_attentions=False)]
    for kw in same:
        model = load(str(out), trust_remote_code=True, **kw)
        assert type(model).__name__ == "Qwen3PlshForCausalLM" and not model.training, kw
        assert model.config._attn_implementation == "plsh_dist", kw
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, want), kw
    bf16 = load(str(out), dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(bf16(input_ids=ids).logits.float(), ref.to(torch.bfloat16)(
            input_ids=ids).logits.float(), atol=0, rtol=0)  # the same bf16 weights, the same computation
    hidden = load(str(out), output_hidden_states=True)
    with torch.no_grad():
        res = hidden(input_ids=ids)
    assert len(res.hidden_states) == 3 and torch.equal(res.logits, want)  # embeddings + 2 layers
    model, info = load(str(out), output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    # transformers' own refusals
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_a_keyword'"):
        load(str(out), not_a_keyword=1)
    with pytest.raises(ValueError, match="device_map as a string"):
        load(str(out), device_map="nowhere")
    with pytest.raises(OSError, match="missing.gguf"):
        load(str(out), gguf_file="missing.gguf")
    # attention weights: refused when loading and in a forward
    for loader in (lambda: load(str(out), output_attentions=True),
                   lambda: hf_config.Qwen3PlshForCausalLM.from_pretrained(str(out), output_attentions=True),
                   lambda: model(input_ids=ids, output_attentions=True)):
        with pytest.raises(ValueError, match="returns no attention weights.*mean over num_samples"):
            loader()
