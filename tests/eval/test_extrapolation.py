"""Length-extrapolation evaluation: mode specs, metrics against a direct
calculation, whole and last-K window scoring, clear errors, outputs, and
sequence-parallel evaluation (2 gloo processes) equal to one process.

A tiny Qwen3 (hidden 32, 2 layers) is exported to a tmp dir with a vocab-320
tokenizer trained on two stdlib modules; everything runs in seconds."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from plsh_dist.biases import bias_for  # noqa: E402
from plsh_dist.checkpoint.loading import load_model  # noqa: E402
from plsh_dist.config import config_from_table, write_resolved  # noqa: E402
from plsh_dist.data.tokenizer import train_tokenizer  # noqa: E402
from plsh_dist.eval.eval_data import load_eval_tokens  # noqa: E402
from plsh_dist.eval.extrapolation import EvalSettings, evaluate_checkpoint, evaluate_model, format_table  # noqa: E402
from plsh_dist.eval.mode_specs import attention_for, parse_modes  # noqa: E402
from plsh_dist.eval.scoring import plan_windows  # noqa: E402
from plsh_dist.models import AttentionConfig, AttentionRuntime, ModelConfig, build_model  # noqa: E402
from tests.eval import extrapolation_worker  # noqa: E402

VOCAB = 384
# Metrics are float64 sums of fp32 cross-entropies computed in another order
# (chunked LM head vs one logits matrix): relative differences ~1e-7.
METRIC_TOL = dict(rel=1e-5)
# SP evaluation: attention partials merged by log-sum-exp across ranks in fp32
# over 2 layers; differences ~1e-7 relative on the loss.
SP_TOL = dict(rel=1e-5, abs=1e-6)


def _export(root: Path, text_file: Path, tok_path: Path, model_vocab: int, name: str) -> Path:
    """Tiny model + resolved config + tokenizer in the layout of launchers/pretrain.py's final/."""
    model_table = dict(family="qwen3", vocab_size=model_vocab, hidden_size=32, num_layers=2, num_heads=2,
                       num_kv_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=4096,
                       rope_theta=10000.0)
    cfg = config_from_table({
        "run": {"out_dir": str(root / name), "seed": 0},
        "model": model_table,
        "attention": {"bias": "plsh", "num_samples": 4, "sigma": 8.0, "rope": False},
        "data": {"train_files": [str(text_file)], "val_files": [str(text_file)], "cache_dir": str(root / "cache"),
                 "min_doc_tokens": 1},
        "tokenizer": {"model_path": str(tok_path), "vocab_size": VOCAB},
    })
    torch.manual_seed(0)
    model = build_model(ModelConfig.from_dict(model_table), AttentionConfig(bias="plsh", sigma=8.0, num_samples=4))
    out = root / name / "final"
    model.save_pretrained(str(out), safe_serialization=True)
    write_resolved(cfg, out)
    shutil.copy2(tok_path, out / "tokenizer.model")
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("extrap")
    text = Path(textwrap.__file__).read_text() + Path(argparse.__file__).read_text()[:40000]
    text_file = root / "eval.txt"
    text_file.write_text(text)
    train_tokenizer([str(text_file)], root / "tok", vocab_size=VOCAB, input_sentence_size=500)
    other = root / "other.txt"
    other.write_text(Path(json.__file__).read_text() * 3 + text[::-1])
    train_tokenizer([str(other)], root / "tok_other", vocab_size=VOCAB + 20, input_sentence_size=500)
    export = _export(root, text_file, root / "tok.model", VOCAB, "run")
    small = _export(root, text_file, root / "tok.model", VOCAB - 40, "small_vocab")
    return argparse.Namespace(root=root, text=text_file, export=export, small=small,
                              other_tok=root / "tok_other.model")


def test_parse_modes():
    modes = parse_modes("plsh:s=8,plsh:s=32:sampler=stratified,alibi,fixed,window:512,none:rope=true,alibi:sigma=64")
    assert [m.bias for m in modes] == ["plsh", "plsh", "alibi", "fixed_blocks", "window", "none", "alibi"]
    assert modes[0].overrides == {"num_samples": 8} and modes[0].stochastic
    assert modes[1].overrides == {"num_samples": 32, "sampler": "stratified"}
    assert modes[4].overrides == {"window": 512} and not modes[4].stochastic
    assert modes[5].overrides == {"rope": True}
    trained = AttentionConfig(bias="plsh", sigma=256.0, num_samples=4, fixed_masks=True)
    alibi = attention_for(modes[2], trained)
    assert (alibi.bias, alibi.sigma, alibi.fixed_masks) == ("alibi", 256.0, False)  # sigma kept from training
    assert attention_for(modes[6], trained).sigma == 64.0
    trunc = parse_modes("truncated:s=20,truncated:c=3.5,truncated")
    assert [m.overrides for m in trunc] == [{"num_samples": 20, "truncate_c": None}, {"truncate_c": 3.5}, {}]
    assert bias_for(attention_for(trunc[0], dataclasses.replace(trained, truncate_c=2.0))).c == pytest.approx(
        math.log(20) + 0.58)
    assert bias_for(attention_for(trunc[2], trained)).c == pytest.approx(math.log(4) + 0.58)
    for bad, match in [("truncated:s=8:c=2", "not both"), ("truncated:c=-1", "truncate_c"), ("truncated:w=9", "not valid")]:
        with pytest.raises(ValueError, match=match):
            parse_modes(bad)
    for bad, match in [("bogus", "unknown mode"), ("plsh:s=0", "num_samples"), ("window", "needs its width"),
                       ("alibi:s=4", "not valid for alibi"), ("plsh:s=x", "not valid"), ("alibi,alibi", "twice"),
                       ("", "empty"), ("plsh:8", "key=value")]:
        with pytest.raises(ValueError, match=match):
            parse_modes(bad)


def test_metrics_equal_direct_calculation(tiny):
    ck = load_model(tiny.export)
    tokens, _ = load_eval_tokens(ck, None)
    L, n_windows = 48, 3
    for spec in ("alibi", "window:16", "none", "plsh:s=3"):
        [row] = evaluate_model(ck.model, ck.trained_attention, tokens,
                               EvalSettings([L], spec, seeds=[5], max_windows=n_windows, progress=False))
        mode = parse_modes(spec)[0]
        runtime = AttentionRuntime(run_seed=5)
        from plsh_dist.models import set_attention_mode

        set_attention_mode(ck.model, attention_for(mode, ck.trained_attention), runtime)
        losses, hits = [], []
        with torch.no_grad():
            for i in range(n_windows):
                runtime.set_step(i)
                w = torch.as_tensor(tokens[i * L : i * L + L + 1].astype("int64"))
                logits = ck.model(input_ids=w[None, :-1], position_ids=torch.arange(L)[None]).logits[0]
                losses.append(F.cross_entropy(logits.double(), w[1:], reduction="none"))
                hits.append(logits.argmax(-1) == w[1:])
        loss = torch.cat(losses).mean().item()
        assert row["tokens"] == n_windows * L and row["windows"] == n_windows
        assert row["loss_mean"] == pytest.approx(loss, **METRIC_TOL)
        assert row["perplexity_mean"] == pytest.approx(math.exp(loss), **METRIC_TOL)
        assert row["bits_per_token_mean"] == pytest.approx(loss / math.log(2), **METRIC_TOL)
        assert row["accuracy_mean"] == pytest.approx(torch.cat(hits).double().mean().item(), abs=1e-12)


def test_last_tokens_scoring_uses_overlapping_windows(tiny):
    wins = plan_windows(100, 32, "last", last_tokens=8)
    assert [w.start for w in wins[:3]] == [0, 8, 16] and all(w.scored == 8 and w.score_from == 24 for w in wins)
    assert wins[-1].start + 33 <= 100 and wins[-1].start + 8 + 33 > 100  # as many as fit
    scored = [w.start + j for w in wins for j in range(w.score_from, w.length)]
    assert len(scored) == len(set(scored)) and scored == list(range(24, 24 + 8 * len(wins)))  # tiles the stream

    ck = load_model(tiny.export)
    tokens, _ = load_eval_tokens(ck, None)
    L, K, n = 40, 10, 3
    [row] = evaluate_model(ck.model, ck.trained_attention, tokens,
                           EvalSettings([L], "alibi", scorings=["last"], last_tokens=K, max_windows=n, progress=False))
    from plsh_dist.models import set_attention_mode

    set_attention_mode(ck.model, attention_for(parse_modes("alibi")[0], ck.trained_attention))
    losses = []
    with torch.no_grad():
        for i in range(n):
            w = torch.as_tensor(tokens[i * K : i * K + L + 1].astype("int64"))  # windows overlap by L - K
            logits = ck.model(input_ids=w[None, :-1], position_ids=torch.arange(L)[None]).logits[0]
            losses.append(F.cross_entropy(logits[-K:].double(), w[-K:], reduction="none"))
    assert row["tokens"] == n * K and row["scored_per_window"] == K
    assert row["loss_mean"] == pytest.approx(torch.cat(losses).mean().item(), **METRIC_TOL)


def test_clear_errors(tiny, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "missing")
    with pytest.raises(ValueError, match="holds no weights"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="does not match"):
        load_model(tiny.export, tokenizer=tiny.other_tok)
    with pytest.raises(ValueError, match="embedding has 344 rows"):
        load_model(tiny.small)
    ck = load_model(tiny.export)
    tokens, _ = load_eval_tokens(ck, None)
    with pytest.raises(ValueError, match="too few for one window of length"):
        evaluate_model(ck.model, ck.trained_attention, tokens,
                       EvalSettings([64, len(tokens)], "alibi", max_windows=None, progress=False))
    with pytest.raises(ValueError, match="matches no file"):
        load_eval_tokens(ck, str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match="unknown mode"):  # checked before the checkpoint is loaded
        evaluate_checkpoint(tmp_path / "missing", EvalSettings([32], "alibi,bogus"))


def test_deepspeed_tag_directory_loads(tiny, tmp_path):
    """A ZeRO 0-2 tag dir (mp_rank_00_model_states.pt with 'module') gives the export's weights."""
    ck = load_model(tiny.export)
    tag = tmp_path / "run" / "checkpoints" / "step_00000004"
    tag.mkdir(parents=True)
    torch.save({"module": ck.model.state_dict()}, tag / "mp_rank_00_model_states.pt")
    (tag / "trainer_state.json").write_text("{}")
    for name in ("config.resolved.json", "tokenizer.model"):
        shutil.copy2(tiny.export / name, tag / name)
    again = load_model(tmp_path / "run")  # a run dir without final/: its newest tag
    assert again.path == tag
    for (k, a), b in zip(ck.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), k


def test_evaluate_checkpoint_writes_outputs(tiny, tmp_path):
    settings = EvalSettings([32, 64], "plsh:s=2,alibi,none", seeds=[0, 1], scorings=["whole", "last"],
                            last_tokens=32, max_windows=2, data=str(tiny.text), progress=False)
    res = evaluate_checkpoint(tiny.export.parent, settings, tmp_path / "out")
    rows = {(r["mode"], r["scoring"], r["length"]): r for r in res["rows"]}
    assert len(rows) == 3 * 2 * 2
    assert rows["plsh:s=2", "whole", 32]["seeds"] == [0, 1] and rows["alibi", "whole", 32]["seeds"] == [0]
    per_seed = [r["loss"] for r in rows["plsh:s=2", "whole", 64]["per_seed"]]
    assert rows["plsh:s=2", "whole", 64]["loss_std"] == pytest.approx(
        (abs(per_seed[0] - per_seed[1]) / math.sqrt(2)), rel=1e-9)  # sample std of two values
    for name in ("results.json", "results.md", "ppl_vs_length.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert any((tmp_path / "out" / "tensorboard").iterdir())
    assert json.loads((tmp_path / "out" / "results.json").read_text())["rows"][0]["mode"] == "plsh:s=2"
    table = format_table(res)
    assert "| plsh:s=2 |" in table and "±" in table and "L=64" in table


def test_sequence_parallel_evaluation_matches_single_process(tiny, tmp_path):
    ck = load_model(tiny.export)
    tokens, _ = load_eval_tokens(ck, None)
    kwargs = dict(lengths=[32, 64], modes="plsh:s=2,fixed,alibi,window:8,none", seeds=[0, 1],
                  scorings=["whole", "last"], last_tokens=16, max_windows=2)
    single = evaluate_model(ck.model, ck.trained_attention, tokens, EvalSettings(progress=False, **kwargs))
    out = tmp_path / "sp_rows.json"
    mp.spawn(extrapolation_worker.run, args=(2, str(tmp_path / "rdzv"), str(tiny.export), kwargs, str(out)),
             nprocs=2, join=True)
    sp = json.loads(out.read_text())
    assert len(sp) == len(single)
    for a, b in zip(single, sp):
        assert (a["mode"], a["scoring"], a["length"], a["tokens"]) == (b["mode"], b["scoring"], b["length"], b["tokens"])
        for sa, sb in zip(a["per_seed"], b["per_seed"]):
            assert sb["loss"] == pytest.approx(sa["loss"], **SP_TOL), (a["mode"], a["length"])
            assert sb["accuracy"] == pytest.approx(sa["accuracy"], abs=1.0 / a["tokens"])  # one argmax tie at most


def test_document_masking_scores_each_document_on_its_own(tiny):
    """document_masking: a token attends within its own document only (each ends with EOS), so the
    window's loss equals separate forwards of its documents; the default attends across them."""
    ck = load_model(tiny.export)
    eos = ck.tokenizer.eos_id
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(5, VOCAB, (2 * 40 + 1,), generator=g)
    tokens[[6, 17, 18, 33, 55]] = eos  # documents of 7, 11, 1, 15, ... tokens, also across windows
    tokens = tokens.numpy()
    L = 40
    kw = dict(max_windows=2, progress=False, seeds=[0])
    [masked] = evaluate_model(ck.model, ck.trained_attention, tokens,
                              EvalSettings([L], "alibi", document_masking=True, **kw), eos_id=eos)
    [plain] = evaluate_model(ck.model, ck.trained_attention, tokens, EvalSettings([L], "alibi", **kw), eos_id=eos)
    from plsh_dist.models import set_attention_mode

    set_attention_mode(ck.model, attention_for(parse_modes("alibi")[0], ck.trained_attention), AttentionRuntime())
    losses = []
    with torch.no_grad():
        for i in range(2):
            w = torch.as_tensor(tokens[i * L : i * L + L + 1].astype("int64"))
            starts = [0] + [j + 1 for j in range(L - 1) if int(w[j]) == eos] + [L]
            for a, b in zip(starts[:-1], starts[1:]):  # each document alone, at its window positions
                logits = ck.model(input_ids=w[None, a:b], position_ids=torch.arange(a, b)[None]).logits[0]
                losses.append(F.cross_entropy(logits.double(), w[a + 1:b + 1], reduction="none"))
    assert masked["loss_mean"] == pytest.approx(torch.cat(losses).mean().item(), **METRIC_TOL)
    assert abs(masked["loss_mean"] - plain["loss_mean"]) > 1e-6


def test_evaluate_launcher_refuses_an_unwritable_out_before_evaluating(tiny, tmp_path):
    """launchers/evaluate.py checks --out first: exit 2 naming it, no evaluation lost."""
    import subprocess
    import sys

    from tests.unwritable import unwritable_dir

    root = Path(__file__).resolve().parents[2]
    with unwritable_dir(tmp_path / "ro") as ro:
        done = subprocess.run([sys.executable, str(root / "launchers" / "evaluate.py"), "--checkpoint",
                               str(tiny.export), "--lengths", "16,32", "--modes", "alibi", "--max-windows", "2",
                               "--out", str(ro / "eval"), "--no-progress"],
                              capture_output=True, text=True, timeout=120, cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(f"evaluate: error: --out = {str(ro / 'eval')!r} would be created in "
                                  f"{str(ro)!r}, not writable"), done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_truncated_export_is_named_by_generate_and_evaluate(tiny, tmp_path):
    """A truncated model.safetensors (an interrupted copy, a full disk): both launchers exit 2 naming it."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    export = tmp_path / "final"
    shutil.copytree(tiny.export, export)
    weights = export / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    for launcher, args in [("generate.py", ["--prompt", "x"]),
                           ("evaluate.py", ["--lengths", "16", "--modes", "alibi", "--out", str(tmp_path / "eval")])]:
        done = subprocess.run([sys.executable, str(root / "launchers" / launcher), "--checkpoint", str(export), *args],
                              capture_output=True, text=True, timeout=120, cwd=root, env=env)
        assert done.returncode == 2, (launcher, done.stderr[-3000:])
        name = launcher.removesuffix(".py")
        assert done.stderr.startswith(f"{name}: error: {weights} is damaged or truncated ("), done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "eval").exists()


def test_progress_in_a_log_is_lines_not_redraws(tiny, capsys):
    """stderr to a file (capsys: not a terminal), as the quickstart's evaluation in a log: plain
    lines, no carriage-return redraws piling up into one line."""
    ck = load_model(tiny.export)
    tokens, _ = load_eval_tokens(ck, None)
    capsys.readouterr()
    evaluate_model(ck.model, ck.trained_attention, tokens, EvalSettings([32], "alibi,plsh:s=2", seeds=[0, 1],
                                                                         max_windows=2, progress=True))
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("extrapolation: ")]
    assert lines[0].startswith("extrapolation: 1/6 window") and lines[-1].startswith("extrapolation: 6/6 window (100%)")
